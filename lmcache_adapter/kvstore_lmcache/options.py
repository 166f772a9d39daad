"""The plugin's options: where they come from, their types, and the errors for bad ones.

Two ways to configure it, both read here:

- plug-in mode (what LMCache recommends): `remote_storage_plugins: ["kvstore"]` and, in
  `extra_config`, `remote_storage_plugin.kvstore.module_path`/`.class_name` (LMCache's
  own keys) plus this plugin's options under the same prefix, the etcd endpoint as
  `remote_storage_plugin.kvstore.url: "kvstore://HOST:PORT"`;
- URL mode: a `kvstore://HOST:PORT?timeout=2&lease_ttl=30` URL with the options as query
  parameters (LMCache's deprecated `remote_url`, or a direct `CreateConnector` call).

An option this plugin does not know is an error (`ConfigError`), never ignored: a typo in
`lease_ttl` would otherwise silently change how long a hit is promised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvstore_client.config_values import coerce

SCHEME = "kvstore://"
PLUGIN_TYPE = "kvstore"
# LMCache's own per-plugin keys: read by its loader, not by this plugin.
LOADER_KEYS = frozenset({"module_path", "class_name"})


class ConfigError(ValueError):
    """A configuration this plugin cannot run with: unknown option, bad value or URL.

    A ValueError, so LMCache's backend set-up logs it and goes on without this remote
    store (the engine keeps running; every lookup is then a local one)."""


@dataclass(frozen=True, slots=True)
class Options:
    etcd: str  # HOST:PORT of the etcd endpoint that names the cluster's leader
    cluster: str = "default"
    # Control-call timeout of the kvstore client: how long one operation may wait for
    # the store before it counts as a miss (LMCache waits up to blocking_timeout_secs).
    timeout: float = 5.0
    # How long a hit reported by batched_async_contains / batched_contains stays pinned
    # when no get follows (LMCache decided not to load, or crashed).
    lease_ttl: float = 30.0
    # After the store failed (unreachable, timed out), calls are misses at once for this
    # long before the next attempt, so a dead store costs one timeout per interval.
    retry_interval: float = 5.0
    # Mixed into every key's namespace: deployments that must not share set different ones.
    namespace: str = ""
    replicas: int = 0  # 0: the cluster's default
    # Register LMCache's CPU buffer with the client so chunks move straight between it and
    # the store (False: through the client's staging buffer, one copy each way).
    zero_copy: bool = True
    transport: str = ""  # "" = the client's default ("fast"); "grpc" forces gRPC
    # On a store node's host, copy straight from its mapped segment (False: always over
    # the Transfer Engine, as from another host).
    same_host: bool = True

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "etcd"]


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """`kvstore://HOST:PORT[?k=v&...]` -> ("HOST:PORT", {k: v})."""
    if not url.startswith(SCHEME):
        raise ConfigError(f"{url!r} is not a kvstore URL: expected kvstore://HOST:PORT "
                          "(the etcd endpoint of the kvstore cluster)")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{url!r}: bad port ({exc})") from exc
    if not parts.hostname or port is None:
        raise ConfigError(f"{url!r} names no etcd endpoint: expected kvstore://HOST:PORT")
    if parts.path not in ("", "/"):
        raise ConfigError(f"{url!r}: a kvstore URL has no path (got {parts.path!r})")
    query: dict[str, str] = {}
    for k, vs in parse_qs(parts.query, keep_blank_values=True).items():
        if len(vs) != 1:
            raise ConfigError(f"{url!r}: option {k!r} given {len(vs)} times")
        query[k] = vs[0]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return f"{host}:{port}", query


def plugin_settings(extra_config: Mapping[str, Any] | None, plugin_name: str) -> dict[str, Any]:
    """This plugin's keys of LMCache's extra_config, prefix stripped, loader keys left out."""
    prefix = f"remote_storage_plugin.{plugin_name}."
    return {k[len(prefix):]: v for k, v in (extra_config or {}).items()
            if k.startswith(prefix) and k[len(prefix):] not in LOADER_KEYS}


def build(etcd: str, raw: Mapping[str, Any], where: str) -> Options:
    """Options from strings or typed values; `where` names their source in errors."""
    known = Options.names()
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"unknown kvstore plugin option(s) {', '.join(unknown)} in {where}; "
                          f"known: url, {', '.join(known)}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        values[name] = _coerce(name, value, where)
    opts = Options(etcd=etcd, **values)
    for name in ("timeout", "lease_ttl"):
        if not getattr(opts, name) > 0:
            raise ConfigError(f"{name} in {where} must be > 0 seconds, got {getattr(opts, name)}")
    if opts.retry_interval < 0 or opts.replicas < 0:
        raise ConfigError(f"retry_interval and replicas in {where} must be >= 0")
    if opts.transport not in ("", "fast", "grpc"):
        raise ConfigError(f"transport in {where} must be 'fast' or 'grpc', got {opts.transport!r}")
    return opts


def _coerce(name: str, value: Any, where: str) -> Any:
    """One option's value as its field's type, by the rule every adapter follows
    (kvstore_client.config_values)."""
    default = {f.name: f.default for f in fields(Options)}[name]
    try:
        return coerce(default, value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"option {name} in {where}: {exc}") from exc
