"""Each engine's configuration is printed once, in its adapter's README, as its tests load
it; the top-level README's Integrations table has one row per engine, linking there.

`integration_rows()` reads the configurations where they are printed:
tests/sglang/test_sglang_readme.py and tests/lmcache/test_lmcache_readme.py load the
same lines through the engines' own parsers, and vLLM's is checked against vLLM's own
config class in tests/vllm/test_readme_config.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"vLLM": "vllm_adapter", "SGLang": "sglang_adapter", "LMCache": "lmcache_adapter"}
# Where each adapter's README prints its configuration (one match each).
PRINTED = {
    "vLLM": re.compile(r"^ *vllm serve MODEL (--kv-transfer-config '[^']*')$", re.M),
    "SGLang": re.compile(r"^ *python -m sglang\.launch_server --model-path MODEL (.*)$", re.M),
    "LMCache": re.compile(r"^```yaml\n(\{.*\})\n```$", re.M),
}


def adapter_readme(engine: str) -> str:
    return (ROOT / ADAPTERS[engine] / "README.md").read_text()


def integration_rows() -> dict[str, str]:
    """engine name -> its configuration, as its adapter's README prints it."""
    rows = {}
    for engine, pattern in PRINTED.items():
        found = pattern.findall(adapter_readme(engine))
        assert len(found) == 1, f"{ADAPTERS[engine]}/README.md prints {len(found)} configurations"
        rows[engine] = found[0]
    return rows


def top_readme_rows() -> dict[str, str]:
    """engine name -> its row of the top-level README's Integrations table."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Integrations"):]
    section = section[:section.index("\n## ", 1)]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| (vLLM|SGLang|LMCache) .*\|$", section, re.M)}


def test_every_engine_has_a_row_with_a_configuration() -> None:
    assert set(integration_rows()) == {"vLLM", "SGLang", "LMCache"}
    assert all(integration_rows().values())
    rows = top_readme_rows()
    assert set(rows) == {"vLLM", "SGLang", "LMCache"}
    for engine, row in rows.items():
        assert f"]({ADAPTERS[engine]}/README.md" in row, f"{engine}'s row links no adapter README"
        assert "{" not in row, f"{engine}'s row prints a configuration: it belongs in its README"


def test_sglang_and_lmcache_rows_are_their_readmes_tested_lines() -> None:
    rows = integration_rows()
    # What test_sglang_readme.py parses: the README's one launch command.
    sglang = [ln.strip() for ln in adapter_readme("SGLang").splitlines()
              if ln.strip().startswith("python -m sglang.launch_server")]
    assert len(sglang) == 1 and sglang[0].endswith(rows["SGLang"])
    assert rows["SGLang"].startswith("--enable-hierarchical-cache ")
    assert '"module_path":"kvstore_sglang"' in rows["SGLang"]
    # What test_lmcache_readme.py loads: the second of the README's two yaml blocks.
    blocks = re.findall(r"```yaml\n(.*?)```", adapter_readme("LMCache"), re.S)
    assert len(blocks) == 2 and blocks[1].strip() == rows["LMCache"]
    assert "remote_storage_plugin.kvstore.module_path: kvstore_lmcache" in rows["LMCache"]
