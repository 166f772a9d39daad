"""`KVStoreConnectorAdapter`: LMCache's entry point for `kvstore://` and `plugin://kvstore`.

LMCache's plug-in loader (`ConnectorManager._remote_adapters_plugin_launcher`) imports
`remote_storage_plugin.<name>.module_path`, takes `.class_name` from it and, for a
ConnectorAdapter subclass, instantiates it with no arguments; `create_connector` is then
called for the first adapter whose `can_parse` accepts the backend's URL:
`plugin://<name>` for a backend listed in `remote_storage_plugins`, or `remote_url`.
"""

from __future__ import annotations

from typing import Any

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext

from kvstore_lmcache.connector import KVStoreConnector
from kvstore_lmcache.options import (
    PLUGIN_TYPE,
    SCHEME,
    ConfigError,
    Options,
    build,
    parse_url,
    plugin_settings,
)

PLUGIN_SCHEME = "plugin://"


def _plugin_type(name: str) -> str:
    return name.split(".", 1)[0]  # LMCache's `{type}.{instance}` plugin names


def options_for_plugin(config: Any, plugin_name: str) -> Options:
    """Options of plug-in `plugin_name` from LMCache's extra_config (see options.py)."""
    raw = plugin_settings(getattr(config, "extra_config", None), plugin_name)
    where = f"extra_config (remote_storage_plugin.{plugin_name}.*)"
    url = raw.pop("url", None)
    if not url:
        raise ConfigError(f"plug-in {plugin_name!r} has no etcd endpoint: set extra_config "
                          f"remote_storage_plugin.{plugin_name}.url to kvstore://HOST:PORT")
    etcd, query = parse_url(str(url))
    both = sorted(set(query) & set(raw))
    if both:
        raise ConfigError(f"option(s) {', '.join(both)} given both in the url and in {where}")
    return build(etcd, {**query, **raw}, where)


def options_for_url(url: str) -> Options:
    etcd, query = parse_url(url)
    return build(etcd, query, f"the url {url!r}")


class KVStoreConnectorAdapter(ConnectorAdapter):
    """Parses `kvstore://HOST:PORT[?options]` and `plugin://kvstore[.instance]`."""

    def __init__(self) -> None:
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(SCHEME):
            return True
        return (url.startswith(PLUGIN_SCHEME)
                and _plugin_type(url[len(PLUGIN_SCHEME):]) == PLUGIN_TYPE)

    def create_connector(self, context: ConnectorContext) -> KVStoreConnector:
        url: str = context.url
        if url.startswith(PLUGIN_SCHEME):
            plugin_name = context.plugin_name or url[len(PLUGIN_SCHEME):]
            options = options_for_plugin(context.config, plugin_name)
        else:
            plugin_name = None
            options = options_for_url(url)  # a URL of another scheme: ConfigError
        return KVStoreConnector(loop=context.loop, local_cpu_backend=context.local_cpu_backend,
                                config=context.config, options=options, metadata=context.metadata,
                                plugin_name=plugin_name)
