"""Feasibility probe (a tool, not the connector): a vLLM KV connector v1 that transfers nothing and logs the call
order and the KV cache tensors vLLM's CPU backend registers, to learn what PdlinkConnector must do."""
from __future__ import annotations

import os
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                KVConnectorRole)

LOG = os.environ.get("PDLPROBE_LOG", "/tmp/pdlprobe/calls.log")


def log(msg: str) -> None:
    with open(LOG, "a") as f:
        f.write(f"pid {os.getpid()} {msg}\n")


class ProbeMeta(KVConnectorMetadata):
    pass


class ProbeConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        pc = vllm_config.parallel_config
        log(f"__init__ role={role} kv_role={vllm_config.kv_transfer_config.kv_role} "
            f"extra={vllm_config.kv_transfer_config.kv_connector_extra_config} tp={pc.tensor_parallel_size} "
            f"block_size={vllm_config.cache_config.block_size} cache_dtype={vllm_config.cache_config.cache_dtype}")

    # worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        prev_end = None
        for name, t in kv_caches.items():
            start = t.data_ptr()
            end = start + t.numel() * t.element_size()
            log(f"register_kv_caches {name} shape={tuple(t.shape)} stride={t.stride()} dtype={t.dtype} "
                f"device={t.device} contiguous={t.is_contiguous()} bytes={end - start} "
                f"adjacent_to_previous={prev_end == start}")
            prev_end = end

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        log("start_load_kv")

    def wait_for_layer_load(self, layer_name: str) -> None:
        log(f"wait_for_layer_load {layer_name}")

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        log(f"save_kv_layer {layer_name} shape={tuple(kv_layer.shape)}")

    def wait_for_save(self) -> None:
        log("wait_for_save")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if finished_req_ids:
            log(f"get_finished {finished_req_ids}")
        return None, None

    # scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        log(f"get_num_new_matched_tokens {request.request_id} computed={num_computed_tokens} "
            f"params={request.kv_transfer_params}")
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        log(f"update_state_after_alloc {request.request_id} blocks={blocks.get_block_ids()} ext={num_external_tokens}")

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return ProbeMeta()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        log(f"request_finished {request.request_id} block_ids={block_ids}")
        return False, {"probe": True}
