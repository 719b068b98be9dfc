"""libpdlink's log level (``include/pdlink/log.h``); ``PDLINK_LOG_LEVEL`` sets it when pdlink is imported."""
from __future__ import annotations

import os

from pdlink._pdlink import lib
from pdlink.errors import InvalidError

__all__ = ["set_log_level"]


def set_log_level(level: str) -> None:
    """Set libpdlink's log level: ``error``, ``warn``, ``info``, ``debug`` or ``trace`` (logs go to
    stderr; the ``PDLINK_LOG_LEVEL`` environment variable sets it at load time)."""
    lvl = lib.pdl_log_level_parse(level.encode())
    if lvl < 0:
        raise InvalidError(lib.PDL_ERR_INVALID, f"log level {level!r}: expected error|warn|info|debug|trace")
    lib.pdlpy_log_set_level(lvl)


def level_from_environment() -> None:
    """Apply ``PDLINK_LOG_LEVEL`` when set (a bad value is ignored: libpdlink keeps its default)."""
    if os.environ.get("PDLINK_LOG_LEVEL"):
        try:
            set_log_level(os.environ["PDLINK_LOG_LEVEL"])
        except InvalidError:
            pass
