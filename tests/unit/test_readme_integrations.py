"""The README's Integrations table prints the configurations its tests load.

SGLang's and LMCache's rows must be, verbatim, the ones in their adapters' READMEs, which
tests/sglang/test_sglang_readme.py and tests/lmcache/test_lmcache_readme.py load as
printed through the engines' own parsers; vLLM's row is checked against vLLM's own config
class in tests/vllm/test_readme_config.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def integration_rows() -> dict[str, str]:
    """engine name -> the configuration cell's code, from the README's table."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Integrations"):text.index("### vLLM")]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| (vLLM|SGLang|LMCache) [^|]*\| `(.*?)` \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_every_engine_has_a_row_with_a_configuration() -> None:
    assert set(integration_rows()) == {"vLLM", "SGLang", "LMCache"}


def test_sglang_and_lmcache_rows_are_their_readmes_tested_lines() -> None:
    rows = integration_rows()
    sglang = (ROOT / "sglang_adapter" / "README.md").read_text()
    assert rows["SGLang"] in sglang
    lmcache = (ROOT / "lmcache_adapter" / "README.md").read_text()
    assert rows["LMCache"] in lmcache
