"""kvstore's LMCache remote-storage plugin (see lmcache_adapter/README.md).

    remote_storage_plugins: ["kvstore"]
    extra_config:
      remote_storage_plugin.kvstore.module_path: kvstore_lmcache
      remote_storage_plugin.kvstore.class_name: KVStoreConnectorAdapter
      remote_storage_plugin.kvstore.url: kvstore://127.0.0.1:2379
"""

from kvstore_lmcache.adapter import KVStoreConnectorAdapter, options_for_plugin, options_for_url
from kvstore_lmcache.connector import FORMAT_VERSION, ConnectorStats, KVStoreConnector, namespace_digest
from kvstore_lmcache.options import PLUGIN_TYPE, SCHEME, ConfigError, Options

__all__ = [
    "FORMAT_VERSION",
    "PLUGIN_TYPE",
    "SCHEME",
    "ConfigError",
    "ConnectorStats",
    "KVStoreConnector",
    "KVStoreConnectorAdapter",
    "Options",
    "namespace_digest",
    "options_for_plugin",
    "options_for_url",
]
