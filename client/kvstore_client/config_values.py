"""Engine adapters' option values, as engines hand them over (JSON or YAML, often strings),
converted to the type of each option's default: one rule for every adapter (vLLM's
kv_connector_extra_config, SGLang's extra-config, LMCache's extra_config and URL)."""

from __future__ import annotations

import math
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int):
        return bool(value)
    raise ValueError(f"not a boolean: {value!r} (expected true/false, yes/no, on/off or 1/0)")


def coerce(default: Any, value: Any, *, strings_only: bool = False) -> Any:
    """`value` as the type of `default` (bool, int, float, else str). Raises ValueError or
    TypeError with what was expected. A number must be finite, an integer whole (2.5 is
    refused, never truncated). `strings_only`: a string option refuses a non-string
    instead of converting it."""
    if isinstance(default, bool):
        return as_bool(value)
    if isinstance(default, int):
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"not an integer: {value!r}")
        return int(value)
    if isinstance(default, float):
        out = float(value)
        if not math.isfinite(out):
            raise ValueError(f"not a finite number: {value!r}")
        return out
    if strings_only and not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return str(value)
