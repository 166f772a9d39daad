"""The backend's options, read from `storage_config.extra_config`.

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name":"kvstore","module_path":"kvstore_sglang",
        "class_name":"KVStoreHiCacheStorage","interface_v1":1,"etcd":"127.0.0.1:2379"}'

Every option has a default; an unknown key is an error (a typo must not silently fall
back to a default). The keys SGLang itself reads from the same dict are accepted and
left to it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kvstore_client.config_values import coerce
from kvstore_sglang.errors import ConfigError

# Read by SGLang, not by us: the dynamic factory's three, the controller's switch to
# the zero-copy v1 calls, and the keys SGLang pops before a backend sees the dict
# (present only when a caller builds HiCacheStorageConfig by hand).
HOST_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
    "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys", "tp_lcm_size",
})


@dataclass(frozen=True)
class Settings:
    etcd: str = "127.0.0.1:2379"
    # Master addresses ("h1:50051,h2:50051", or a DNS name) instead of etcd: the client
    # asks them who leads (kvstore_client.discovery) and never talks to etcd.
    master: str = ""
    cluster: str = "default"
    # Control calls give up after this long; the store then counts as down (misses,
    # failed sets at once) for `retry_interval` seconds before it is tried again.
    timeout: float = 2.0
    retry_interval: float = 5.0
    # Pages batch_exists reports stay pinned this long unless read first.
    lease_ttl: float = 30.0
    # Model identity for the key namespace instead of SGLang's model name (set it to
    # share pages between engines that name the same weights differently).
    model_id: str = ""
    # Transfer Engine options of the data path.
    host: str = "127.0.0.1"
    protocol: str = "tcp"
    device: str = ""
    same_host: bool = True
    # Registered bounce memory for the generic (copying) get/set API.
    staging_bytes: int = 16 << 20
    # Security: a file holding the client token (never the token itself: SGLang logs
    # its server args), the CA of the master's certificate, and the name to check it
    # for. Unset: $KVSTORE_TOKEN / $KVSTORE_TLS_CA / the credentials file.
    token_file: str = ""
    tls_ca: str = ""
    tls_server_name: str = ""

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> Settings:
        extra = {k: v for k, v in dict(extra or {}).items() if k not in HOST_KEYS}
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ConfigError(f"unknown hicache-storage-backend-extra-config key(s) for "
                              f"KVStoreHiCacheStorage: {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, value in extra.items():
            default = known[name].default
            try:
                values[name] = coerce(default, value, strings_only=True)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"extra-config key {name!r}: {exc}") from exc
        s = cls(**values)
        for name in ("timeout", "retry_interval", "lease_ttl"):
            if getattr(s, name) <= 0:
                raise ConfigError(f"extra-config key {name!r} must be > 0, got {getattr(s, name)}")
        if s.staging_bytes <= 0:
            raise ConfigError(f"extra-config key 'staging_bytes' must be > 0, got {s.staging_bytes}")
        return s
