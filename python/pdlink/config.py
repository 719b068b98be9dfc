"""The model's KV geometry and the instance configuration: MoRIIO's ``--kv-transfer-config`` parsed by
libpdlink's own parser (``pdl_connector_config_parse``) into ``pdl_instance_config_t``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Union

from pdlink._pdlink import ffi, lib
from pdlink.errors import InvalidError, check, new_error

__all__ = ["Geometry", "JsonConfig", "connector_config", "kv_region_len"]

#: A whole ``--kv-transfer-config`` (or kv_transfer_params): a dict or its JSON text.
JsonConfig = Union[str, Mapping[str, Any]]


def json_text(value: JsonConfig) -> bytes:
    """JSON text as C takes it: a str as it is, a mapping encoded."""
    if isinstance(value, str):
        return value.encode()
    return json.dumps(dict(value)).encode()


@dataclass(frozen=True)
class Geometry:
    """The model's KV geometry as a whole instance sees it (per-rank heads follow from the TP size).

    ``order`` is ``"hnd"`` (vLLM's CPU/flash layout: heads, then tokens, inside a block) or ``"nhd"``;
    ``kv_separate`` puts all K blocks before all V blocks of a layer (vLLM's ``[2, num_blocks, ...]``),
    otherwise K and V alternate per block. ``kv_fused``: vLLM's CPU cache, one tensor per layer of
    shape ``(num_blocks, heads, block_size, 2 * head_dim)`` -- K then V in each token's row (with
    ``order="hnd"``; ``kv_separate`` is then ignored). ``elem_size`` is bytes per element (2 for
    bf16/fp16, 4 for float32)."""

    num_layers: int
    total_kv_heads: int
    head_dim: int
    block_size: int
    elem_size: int = 2
    is_mla: bool = False
    order: str = "hnd"
    kv_separate: bool = True
    kv_fused: bool = False


def connector_config(config: JsonConfig, *, strict: bool = False) -> Dict[str, Any]:
    """Parse a whole ``--kv-transfer-config`` (a dict or JSON text) with libpdlink's own parser and return
    what it settled on, defaults filled in: ``role`` ("producer"/"consumer"), ``host_ip``, ``proxy_ip``,
    ``proxy_ping_port``, ``http_port``, ``handshake_port``, ``notify_port`` (the bases), ``read_mode``
    and ``backend`` (after "rdma" was mapped). For a process that needs the values without creating an
    instance (vLLM's scheduler). ``strict``: an unknown ``kv_connector_extra_config`` key is an error
    naming the nearest known one (``pdl_connector_config_check``, what ``pdlink check-config`` runs)
    instead of a warning. Raises :class:`InvalidError` naming a bad key or value."""
    c = ffi.new("pdl_connector_config_t *")
    err = new_error()
    parse = lib.pdl_connector_config_check if strict else lib.pdl_connector_config_parse
    check(parse(json_text(config), c, err), err)
    return {
        "role": "producer" if c.role == lib.PDL_ROLE_PRODUCER else "consumer",
        "host_ip": ffi.string(c.host_ip).decode(),
        "proxy_ip": ffi.string(c.proxy_ip).decode(),
        "proxy_ping_port": int(c.proxy_ping_port),
        "http_port": int(c.http_port),
        "handshake_port": int(c.handshake_port),
        "notify_port": int(c.notify_port),
        "read_mode": bool(c.read_mode),
        "backend": ffi.string(lib.pdl_backend_name(c.backend)).decode(),
    }


def instance_config(config: JsonConfig, geometry: Geometry, tp_size: int, num_blocks: int, dp_rank: int,
                    dp_size: int, allow_write_mode: bool, local_rank: Optional[int] = None,
                    external_blocks: bool = False) -> Any:
    """A ``pdl_instance_config_t *`` from the Python arguments (KV memory not set yet). Raises
    :class:`InvalidError` naming a bad key, value or argument."""
    c = ffi.new("pdl_instance_config_t *")
    lib.pdl_instance_config_defaults(c)  # local_rank -1: a zeroed config would run rank 0 only
    err = new_error()
    check(lib.pdl_connector_config_parse(json_text(config), ffi.addressof(c, "conn"), err), err)
    if geometry.order not in ("hnd", "nhd"):
        raise InvalidError(lib.PDL_ERR_INVALID, f"geometry.order {geometry.order!r}: expected 'hnd' or 'nhd'")
    m = c.model
    m.num_layers = geometry.num_layers
    m.total_kv_heads = geometry.total_kv_heads
    m.head_dim = geometry.head_dim
    m.elem_size = geometry.elem_size
    m.block_size = geometry.block_size
    m.is_mla = geometry.is_mla
    m.order = lib.PDL_KV_HND if geometry.order == "hnd" else lib.PDL_KV_NHD
    m.kv_separate = geometry.kv_separate
    m.kv_fused = geometry.kv_fused
    c.tp_size = tp_size
    c.dp_rank = dp_rank
    c.dp_size = dp_size
    if not 0 < num_blocks < 2**32:
        raise InvalidError(lib.PDL_ERR_INVALID, f"num_blocks {num_blocks}: expected 1 .. 2^32-1")
    c.num_blocks = num_blocks
    c.allow_write_mode = allow_write_mode
    if local_rank is not None and not (isinstance(local_rank, int) and 0 <= local_rank < tp_size):
        raise InvalidError(lib.PDL_ERR_INVALID, f"local_rank {local_rank!r}: expected None or 0 .. {tp_size - 1}")
    c.local_rank = -1 if local_rank is None else local_rank
    c.external_blocks = external_blocks
    return c


def kv_region_len(geometry: Geometry, tp_size: int, num_blocks: int, rank: int) -> int:
    """Bytes of rank ``rank``'s KV region (every layer, one after the other): the size of the buffer to
    pass for that rank in ``Instance(kv_buffers=...)``. Raises :class:`InvalidError` for a bad rank or
    geometry."""
    c = instance_config('{"kv_role": "kv_consumer"}', geometry, tp_size, num_blocks, 0, 1, True)
    out = ffi.new("uint64_t *")
    err = new_error()
    check(lib.pdl_instance_kv_region_len(c, rank, out, err), err)
    return int(out[0])
