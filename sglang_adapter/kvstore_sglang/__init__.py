"""kvstore as an SGLang HiCache storage backend (see sglang_adapter/README.md).

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name":"kvstore","module_path":"kvstore_sglang",
        "class_name":"KVStoreHiCacheStorage","interface_v1":1,"etcd":"127.0.0.1:2379"}'
"""

from kvstore_sglang.backend import KVStoreHiCacheStorage, Stats
from kvstore_sglang.errors import (
    BadKey,
    ConfigError,
    KVStoreSGLangError,
    NotRegistered,
    PageSizeMismatch,
    UnsupportedLayout,
)
from kvstore_sglang.settings import Settings

__all__ = [
    "BadKey",
    "ConfigError",
    "KVStoreHiCacheStorage",
    "KVStoreSGLangError",
    "NotRegistered",
    "PageSizeMismatch",
    "Settings",
    "Stats",
    "UnsupportedLayout",
]
