"""The logger of pdlink.vllm: vLLM's own, so pdlink's lines share vLLM's handler, format and level.

vLLM configures one logger, "vllm" (its handler, ``VLLM_LOGGING_LEVEL``, ``VLLM_LOGGING_STREAM``), and
its modules log through ``vllm.logger.init_logger(__name__)``, i.e. children of it. pdlink's modules
are not under ``vllm.``, so they log as the child "vllm.pdlink": vLLM's configuration applies to them
with no handler of pdlink's own, and in a process without vLLM (the tests) the lines go wherever that
process's logging sends them. The scheduler and worker halves import nothing of vLLM, so they take the
logger by name here; :mod:`pdlink.vllm.connector` takes the same object from ``init_logger``.
"""
from __future__ import annotations

import logging

LOGGER_NAME = "vllm.pdlink"

log = logging.getLogger(LOGGER_NAME)
