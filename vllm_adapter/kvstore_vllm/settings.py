"""The connector's options, read from `kv_connector_extra_config`.

    --kv-transfer-config '{"kv_connector": "KVStoreConnector",
                           "kv_connector_module_path": "kvstore_vllm",
                           "kv_role": "kv_both",
                           "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"etcd": "127.0.0.1:2379"}}'

Every option has a default; an unknown option is an error (a typo must not silently
fall back to a default).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kvstore_client.config_values import coerce

ROLES = ("kv_both", "kv_producer", "kv_consumer")


@dataclass(frozen=True)
class Settings:
    etcd: str = "127.0.0.1:2379"
    master: str = ""  # a fixed master address instead of finding the leader in etcd
    cluster: str = "default"
    # Control calls give up after this long; the store is then treated as down (misses,
    # no saves) for `retry_interval` seconds before it is tried again.
    timeout: float = 2.0
    retry_interval: float = 5.0
    # Lease on looked-up blocks, from lookup until the load has finished.
    lease_ttl: float = 30.0
    # Wait for each layer's KV just before its attention runs, instead of all of them
    # before the first layer.
    layerwise_load: bool = False
    # Also save blocks filled while decoding (the default saves prompt blocks only).
    save_decode: bool = False
    # Model identity for the key namespace; default: the model name or path plus a
    # fingerprint of its config and weight files. Set it to share across paths.
    model_id: str = ""
    # Transfer Engine options of the worker's data path.
    host: str = "127.0.0.1"
    protocol: str = "tcp"
    device: str = ""
    same_host: bool = True
    # Log each request's load timeline at INFO (otherwise at DEBUG).
    log_timeline: bool = False
    # Where sliding-window groups save their window: "" follows vLLM's
    # prefix_cache_retention_interval, "dense" saves every block, "0" only where a later
    # request can resume (the prompt's end, prefixes shared with stored requests), "N"
    # also every N tokens.
    sliding_window_checkpoints: str = ""
    # Registered staging memory for layouts whose pages are not contiguous.
    staging_bytes: int = 64 << 20
    # GPU KV caches: "auto" moves contiguous pages GPU-direct when the Transfer Engine
    # is a CUDA build and stages them through host memory otherwise; "on" refuses to
    # start without GPU-direct; "off" always stages. The start-up log says which.
    gpu_direct: str = "auto"
    # Security: a file holding the client token (never the token itself: vLLM logs its
    # config), the CA of the master's certificate, and the name to check it for. Unset:
    # $KVSTORE_TOKEN / $KVSTORE_TLS_CA / the credentials file, as for any client.
    token_file: str = ""
    tls_ca: str = ""
    tls_server_name: str = ""

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> Settings:
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config option(s) for KVStoreConnector: "
                             f"{unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, value in extra.items():
            default = known[name].default
            try:
                values[name] = coerce(default, value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"kv_connector_extra_config option {name!r}: {exc}") from exc
        s = cls(**values)
        for name in ("timeout", "retry_interval", "lease_ttl"):
            if getattr(s, name) <= 0:
                raise ValueError(f"kv_connector_extra_config option {name!r} must be > 0")
        return s


def role_flags(kv_role: str | None) -> tuple[bool, bool]:
    """(loads, saves) for a vLLM kv_role."""
    role = kv_role or "kv_both"
    if role not in ROLES:
        raise ValueError(f"KVStoreConnector supports kv_role {ROLES}, got {role!r}")
    return role != "kv_producer", role != "kv_consumer"
