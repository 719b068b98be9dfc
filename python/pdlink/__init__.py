"""pdlink from Python: move the KV cache of a prompt from a prefill instance to a decode instance.

pdlink is a C library speaking vLLM's MoRIIO connector protocol (ZeroMQ + msgpack handshake,
releases, discovery pings) with heterogeneous tensor parallelism. This package wraps its connector
API (``include/pdlink/connector.h``) through a cffi extension compiled against the repository's
libpdlink. One :class:`Instance` is one serving instance (one ``vllm serve``) with ``tp_size`` ranks.

READ mode (the seed's flow)::

    prefill = pdlink.Instance(cfg_producer, geometry, tp_size=4, num_blocks=64)
    ids = prefill.alloc_blocks(3); ...write the KV into prefill.kv_layer(rank, layer)...
    prefill.hold("req-1", ids)
    params = prefill.params("req-1", ids)          # kv_transfer_params, a dict for the router
    decode = pdlink.Instance(cfg_consumer, geometry, tp_size=8, num_blocks=64)
    local = decode.alloc_blocks(3)
    with decode.pull(params, local) as pull:        # every decode rank reads its heads, then releases
        pull.wait()

KV memory is either the instance's own (``kv_layer`` gives writable views) or the caller's: pass
``kv_buffers``, one writable C-contiguous buffer per rank (numpy arrays, ``bytearray``, torch CPU
tensors) of at least :func:`kv_region_len` bytes; pdlink then moves KV straight into and out of them.
Contiguous torch CUDA tensors (one GPU per instance) are registered as device memory with the
``cuda`` backend (GPUs of one host, CUDA IPC) unless the config names a backend: ``ucx`` is kept, and
``tcp`` moves them between any two hosts through pinned host staging windows (where the CUDA driver
loads); ``shm`` is refused. The CPU never touches them.

Inside vLLM (one worker process per TP rank, block ids owned by vLLM's scheduler, the CPU cache's
K and V concatenated per token): ``Instance(..., local_rank=rank, external_blocks=True,
kv_buffers=[that rank's cache])`` with ``Geometry(..., kv_fused=True)``; the producer reports a
transfer finished when :meth:`Instance.events` yields ``(Event.FREED, transfer_id, -1)``.

Errors raise :class:`PdlinkError` (or a subclass) carrying pdlink's own message.

The modules, one concern each (this file only re-exports their public names):
:mod:`pdlink.errors` (exceptions), :mod:`pdlink.log`, :mod:`pdlink.config` (``Geometry``, the
``--kv-transfer-config``), :mod:`pdlink.memory` (``kv_buffers``), :mod:`pdlink.instance`,
:mod:`pdlink.transfer` (``Pull``, ``Recv``), :mod:`pdlink.events`, :mod:`pdlink.counters`,
:mod:`pdlink.topo` (``plan``); ``pdlink._pdlink`` is the cffi extension (``_build.py``, ``shim.c``).
"""
from __future__ import annotations

from pdlink.config import Geometry, JsonConfig, connector_config, kv_region_len
from pdlink.counters import counter_names
from pdlink.errors import InvalidError, PdlinkError, TransferTimeout
from pdlink.events import Event
from pdlink.instance import Instance
from pdlink.log import level_from_environment, set_log_level
from pdlink.topo import plan
from pdlink.transfer import Pull, Recv

__all__ = [
    "PdlinkError", "InvalidError", "TransferTimeout", "Geometry", "JsonConfig", "Instance", "Pull", "Recv",
    "Event", "plan", "kv_region_len", "counter_names", "set_log_level", "connector_config",
]
__version__ = "0.1.0"

level_from_environment()
