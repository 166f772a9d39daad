"""ClientOptions: one set of settings for both clients, keywords over an options object."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from kvstore_client import AsyncKVStoreClient, ClientOptions, KVStoreClient


def test_keywords_and_etcd_go_over_the_options_given() -> None:
    base = ClientOptions(timeout=3.0, same_host=False)
    got = ClientOptions.of(base, "10.0.0.1:2379", {"timeout": 5.0})
    assert (got.etcd, got.timeout, got.same_host) == ("10.0.0.1:2379", 5.0, False)
    assert ClientOptions.of(base, None, {}) is base
    assert ClientOptions.of(None, None, {}) == ClientOptions()


def test_an_unknown_setting_is_a_type_error_naming_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"etdc.*a client takes etcd, master"):
        ClientOptions.of(None, None, {"etdc": "x"})
    with pytest.raises(TypeError, match="etdc"):
        KVStoreClient(etdc="x")
    with pytest.raises(TypeError, match="etdc"):
        AsyncKVStoreClient(etdc="x")


def test_both_clients_take_the_same_settings() -> None:
    for cls in (KVStoreClient, AsyncKVStoreClient):
        params = inspect.signature(cls.__init__).parameters
        assert list(params) == ["self", "etcd", "options", "settings"]
    assert [f.name for f in dataclasses.fields(ClientOptions)][:4] == [
        "etcd", "master", "cluster", "timeout"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ClientOptions().timeout = 1.0  # type: ignore[misc]


def test_the_transport_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSTORE_TRANSPORT", raising=False)
    assert ClientOptions().transport_name() == "fast"
    monkeypatch.setenv("KVSTORE_TRANSPORT", "grpc")
    assert ClientOptions().transport_name() == "grpc"
    assert ClientOptions(transport="fast").transport_name() == "fast"
