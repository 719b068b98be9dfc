"""Where this vLLM instance listens and the kv_transfer_params a READ-mode prefill returns, from the
--kv-transfer-config and vLLM's parallel config alone (the scheduler process has no pdlink instance)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Sequence, Tuple


@dataclass(frozen=True)
class Endpoint:
    """Where this instance's rank 0 listens, as the params name it (ranks add their offsets)."""
    host: str
    handshake_port: int
    notify_port: int
    role: str            # "producer" or "consumer"
    read_mode: bool


def parse_endpoint(config: Mapping[str, Any]) -> Endpoint:
    """Validate the whole --kv-transfer-config with libpdlink's strict parser (so a bad value or an
    unknown key fails here, when vLLM creates the connector, with pdlink's message naming it and, for a
    key, the nearest known one) and return what the params need. Raises :class:`pdlink.InvalidError`."""
    import pdlink

    c = pdlink.connector_config(config, strict=True)
    return Endpoint(host=c["host_ip"], handshake_port=c["handshake_port"], notify_port=c["notify_port"],
                    role=c["role"], read_mode=c["read_mode"])


def dp_of(pc: Any) -> Tuple[int, int]:
    """This engine's DP rank and a DP size covering it. vLLM runs the DP ranks of a dense (non-MoE) model
    as independent engines, each reconfigured to data_parallel_rank 0 of size 1; its original rank stays
    in data_parallel_index. pdlink's ports are base + dp_rank * tp + rank, so the rank must be the
    original one, or every DP engine binds DP 0's ports. The original size is not kept: the size is at
    least rank + 1, which the params' remote_dp_rank needs; vLLM's front end then balances requests
    over its engines itself."""
    rank = int(getattr(pc, "data_parallel_index", pc.data_parallel_rank))
    return rank, max(int(pc.data_parallel_size), rank + 1)


def transfer_params(ep: Endpoint, *, transfer_id: str, block_ids: Sequence[int], tp_size: int, dp_rank: int,
                    dp_size: int) -> Dict[str, Any]:
    """The kv_transfer_params a READ-mode prefill returns: the same keys and values as pdlink's
    ``Instance.params`` (``pdl_instance_params`` + ``pdl_kv_params_to_json``), computed from the config
    alone because the scheduler process has no instance. ``remote_engine_id`` is ``host:handshake_base``,
    the id each producer rank's handshake answers with (a consumer refuses a mismatch)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [int(b) for b in block_ids],
        "remote_engine_id": f"{ep.host}:{ep.handshake_port}",
        "remote_host": ep.host,
        "remote_handshake_port": ep.handshake_port,
        "remote_notify_port": ep.notify_port,
        "remote_dp_size": max(dp_size, 1),
        "tp_size": tp_size,
        "transfer_id": transfer_id,
        "remote_dp_rank": dp_rank,
    }
