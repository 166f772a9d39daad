"""Engine adapters' option values, as engines hand them over (JSON or YAML, often strings),
converted to the type of each option's default: one rule for every adapter."""

from __future__ import annotations

from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    if isinstance(value, int):
        return bool(value)
    raise ValueError(f"expected a boolean, got {value!r}")


def coerce(default: Any, value: Any, *, strings_only: bool = False) -> Any:
    """`value` as the type of `default` (bool, int, float, else str). Raises ValueError or
    TypeError with what was expected. `strings_only`: a string option refuses a non-string
    instead of converting it."""
    if isinstance(default, bool):
        return as_bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    if strings_only and not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return str(value)
