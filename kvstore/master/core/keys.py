"""The one key check of the core: what a usable object key is, for every verb.

A key is bytes (a bytearray is copied to bytes), non-empty and at most MAX_KEY_BYTES
long. A batch verb gives an unusable key a per-key INVALID_ARGUMENT (core.py, Rule 3);
lookup, which answers for a prefix, raises instead. The usual key (bytes of a valid
length) is checked inline, without a call per key: batches are up to max_batch keys and
a Python call per key would cost more than the check.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvstore.errors import MAX_KEY_BYTES, InvalidArgument, check_key


def norm_key(key: object) -> bytes | None:
    """The key as hashable bytes, or None when it is not a usable key."""
    if type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES:
        return key
    try:
        check_key(key)  # type: ignore[arg-type]
    except InvalidArgument:
        return None
    return bytes(key)  # type: ignore[call-overload]


def norm_keys(keys: Iterable[object]) -> list[bytes | None]:
    """norm_key() of each key, in order."""
    return [k if type(k) is bytes and 0 < len(k) <= MAX_KEY_BYTES else norm_key(k)
            for k in keys]


def all_valid(keys: Sequence[object]) -> bool:
    """True when every key is already a usable key as it is (bytes of a valid length),
    checked without a Python-level loop; False for an empty batch."""
    if len(keys) == 1:  # the single get: its checks without building a set
        k = keys[0]
        return type(k) is bytes and 0 < len(k) <= MAX_KEY_BYTES
    try:
        return (bool(keys) and set(map(type, keys)) == {bytes}
                and min(map(len, keys)) > 0  # type: ignore[arg-type]
                and max(map(len, keys)) <= MAX_KEY_BYTES)  # type: ignore[arg-type]
    except TypeError:
        return False


def bad_key_message(key: object) -> str:
    """Why `key` is not usable ("" when it is)."""
    try:
        check_key(key)  # type: ignore[arg-type]
    except InvalidArgument as err:
        return err.message
    return ""


def hashable(keys: Iterable[object]) -> list[bytes]:
    """The keys as bytes; InvalidArgument at the first unusable one."""
    out: list[bytes] = []
    for key in keys:
        k = norm_key(key)
        if k is None:
            raise InvalidArgument(bad_key_message(key))
        out.append(k)
    return out
