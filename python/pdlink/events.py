"""Held-transfer events (``pdl_instance_event_t``, ``pdl_instance_set_event_fn``). pdlink's threads
report them to a queue in C (the shim in ``shim.c``), never waiting for Python's GIL;
:meth:`Instance.events` takes them from there."""
from __future__ import annotations

import enum
from typing import Any, List, Tuple

from pdlink._pdlink import ffi, lib
from pdlink.errors import PdlinkError

__all__ = ["Event"]


class Event(enum.IntEnum):
    """What happened to a held transfer, as C's ``pdl_instance_event_t``."""

    #: A producer rank's release fan-in completed (``PDL_EVENT_RANK_REPORTED``).
    RANK_REPORTED = lib.PDL_EVENT_RANK_REPORTED
    #: A producer rank reaped the transfer after defer_timeout (``PDL_EVENT_RANK_EXPIRED``).
    RANK_EXPIRED = lib.PDL_EVENT_RANK_EXPIRED
    #: Every rank this object runs resolved the transfer; its blocks may be reused (``PDL_EVENT_FREED``).
    FREED = lib.PDL_EVENT_FREED


class EventQueue:
    """The C queue attached to one instance. Free it after the instance is destroyed."""

    def __init__(self, inst: Any) -> None:
        self._q = lib.pdlpy_events_attach(inst)
        if self._q == ffi.NULL:
            raise PdlinkError(lib.PDL_ERR_NOMEM, "instance: out of memory for the event queue")
        self._tid = ffi.new("char[]", 1024)
        self._ev, self._rank = ffi.new("int *"), ffi.new("int *")

    def take(self) -> List[Tuple[Event, str, int]]:
        """Every queued event, oldest first: ``(event, transfer_id, rank)``, rank -1 for FREED."""
        out = []
        while lib.pdlpy_events_take(self._q, self._ev, self._rank, self._tid, len(self._tid)):
            ev = Event(self._ev[0])
            out.append((ev, ffi.string(self._tid).decode(errors="replace"),
                        -1 if ev == Event.FREED else int(self._rank[0])))
        return out

    def free(self) -> None:
        if self._q is not None:
            lib.pdlpy_events_free(self._q)
            self._q = None
