"""A stand-in for a P/D connector (NIXL, Mooncake P2P) to sit next to ours in a
MultiConnector: it claims `tokens` external tokens for every request, loads nothing,
and records what it was told."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

CALLS: list[tuple[str, str, int]] = []


class FakeP2PMetadata(KVConnectorMetadata):
    def __init__(self, loads: dict[str, int]) -> None:
        self.loads = loads


class FakeP2PConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.tokens = int(self._kv_transfer_config.kv_connector_extra_config.get("tokens", 0))
        self._pending: dict[str, int] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return max(0, min(self.tokens, request.num_tokens - 1) - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        CALLS.append(("alloc", request.request_id, num_external_tokens))
        if num_external_tokens:
            self._pending[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        loads, self._pending = self._pending, {}
        return FakeP2PMetadata(loads)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None
