"""The one rule the engine adapters convert their option values by
(kvstore_client.config_values): what each type accepts and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore_client.config_values import coerce


@pytest.mark.parametrize("default,value,out", [
    (True, "false", False), (False, " Yes ", True), (True, 0, False), (False, "on", True),
    (1, "7", 7), (1, 3.0, 3), (1.0, "2.5", 2.5), (1.0, 4, 4.0), ("", 5, "5"),
])
def test_values_become_the_defaults_type(default: Any, value: Any, out: Any) -> None:
    got = coerce(default, value)
    assert got == out and type(got) is type(out)


@pytest.mark.parametrize("default,value,match", [
    (True, "maybe", "not a boolean"), (True, 1.5, "not a boolean"),
    (1, 2.5, "not an integer"), (1, "x", "invalid literal"),
    (1.0, "nan", "finite"), (1.0, "inf", "finite"), (1.0, "soon", "could not convert"),
])
def test_bad_values_are_refused_with_what_was_expected(default: Any, value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        coerce(default, value)


def test_strings_only_refuses_a_non_string() -> None:
    with pytest.raises(ValueError, match="expected a string"):
        coerce("", 5, strings_only=True)
    assert coerce("", "x", strings_only=True) == "x"
