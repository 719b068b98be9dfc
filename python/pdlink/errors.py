"""pdlink's errors as Python exceptions: one class per kind of failure, each carrying the C status and
pdlink's own message (``include/pdlink/status.h``)."""
from __future__ import annotations

from typing import Any

from pdlink._pdlink import ffi, lib

__all__ = ["PdlinkError", "InvalidError", "TransferTimeout"]


class PdlinkError(Exception):
    """A pdlink call failed. ``status`` is the C status code (negative), ``status_name`` its name
    (``"PDL_ERR_INVALID"``), and ``str(e)`` pdlink's message naming the key, rank or peer at fault."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.status_name = ffi.string(lib.pdl_status_name(status)).decode()
        self.message = message
        super().__init__(f"{message} ({self.status_name})")


class InvalidError(PdlinkError, ValueError):
    """PDL_ERR_INVALID / PDL_ERR_PARSE: the arguments or the configuration are wrong."""


class TransferTimeout(PdlinkError, TimeoutError):
    """PDL_ERR_TIMEOUT: a transfer's own deadline passed (transfer_timeout, a handshake) and it failed.
    A wait whose own timeout ran out is not an error: :meth:`Pull.wait` and :meth:`Recv.wait` return
    False then (PDL_INPROGRESS)."""


_CLASSES = {lib.PDL_ERR_INVALID: InvalidError, lib.PDL_ERR_PARSE: InvalidError,
            lib.PDL_ERR_TIMEOUT: TransferTimeout}


def error_class(status: int) -> type:
    """The exception class for a failing C status."""
    return _CLASSES.get(status, PdlinkError)


def new_error() -> Any:
    """A zeroed ``pdl_error_t`` for a C call to fill."""
    return ffi.new("pdl_error_t *")


def raise_error(st: int, err: Any) -> None:
    """Raise the exception for status ``st`` with ``err``'s message (the status's text when empty)."""
    msg = ffi.string(err.msg).decode(errors="replace") or ffi.string(lib.pdl_status_string(st)).decode()
    raise error_class(st)(st, msg)


def check(st: int, err: Any) -> None:
    """Raise unless ``st`` is PDL_OK."""
    if st != lib.PDL_OK:
        raise_error(st, err)
