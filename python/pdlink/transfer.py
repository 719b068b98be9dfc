"""Transfers in flight on a consumer: a READ-mode :class:`Pull` (``pdl_pull_t``) and a WRITE-mode
:class:`Recv` (``pdl_recv_t``). Their waits return False when the wait's own timeout ran out
(PDL_INPROGRESS: the transfer goes on) and raise when the transfer failed."""
from __future__ import annotations

from typing import Any, Callable, Optional

from pdlink._pdlink import lib
from pdlink.errors import PdlinkError, check, new_error

__all__ = ["Pull", "Recv"]


class _Transfer:
    """A C transfer handle with a wait and a free; ``with`` closes it."""

    _what = "transfer"

    def __init__(self, inst: Any, handle: Any) -> None:
        self._inst = inst        # the instance outlives the handle
        self._h = handle

    def _wait(self, wait_fn: Callable[[Any, int, Any], int], timeout: Optional[float]) -> bool:
        if self._h is None:
            raise PdlinkError(lib.PDL_ERR_BAD_STATE, f"{self._what}: already closed")
        err = new_error()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        st = wait_fn(self._h, ms, err)
        if st == lib.PDL_INPROGRESS:
            return False         # the wait ran out; the transfer goes on
        check(st, err)
        return True

    def _free(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the handle (never waits: ranks still moving bytes keep their own reference)."""
        if self._h is not None:
            self._free()
            self._h = None

    def __enter__(self) -> "_Transfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Pull(_Transfer):
    """A READ-mode pull in flight (:meth:`Instance.pull`). Wait with :meth:`wait`; close it (or use
    ``with``) when done. The local blocks must not be freed or written before it finished."""

    _what = "pull"

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until finished). True when every rank read its plan;
        False when ranks are still reading (call again). Raises :class:`PdlinkError` with the first
        failing rank's message when the pull failed (the blocks then hold garbage)."""
        return self._wait(lib.pdl_pull_wait, timeout)

    @property
    def bytes(self) -> int:
        """KV bytes read by every rank (final once finished)."""
        return int(lib.pdl_pull_bytes(self._h)) if self._h is not None else 0

    @property
    def descriptors(self) -> int:
        """Transfer descriptors posted by every rank."""
        return int(lib.pdl_pull_descriptors(self._h)) if self._h is not None else 0

    def _free(self) -> None:
        lib.pdl_pull_free(self._h)

    def __enter__(self) -> "Pull":
        return self


class Recv(_Transfer):
    """A WRITE-mode receive (:meth:`Instance.expect_push`): the decode waits for the prefill's pushes."""

    _what = "recv"

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True when every rank counted all its write_done with status ok; False when ranks still wait
        (only with a timeout); raises :class:`PdlinkError` for a failed push
        (:class:`TransferTimeout` past transfer_timeout)."""
        return self._wait(lib.pdl_recv_wait, timeout)

    def write_done(self, rank: int) -> int:
        """write_done messages consumer rank ``rank`` counted."""
        return int(lib.pdl_recv_write_done(self._h, rank))

    def _free(self) -> None:
        lib.pdl_recv_free(self._h)

    def __enter__(self) -> "Recv":
        return self
