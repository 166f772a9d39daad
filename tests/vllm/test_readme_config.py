"""vllm_adapter/README.md's configuration, as printed, through vLLM's own KVTransferConfig, and
the same settings the engine tests run with (tests/vllm/helpers.connector_config)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.unit.test_readme_integrations import integration_rows
from tests.vllm.helpers import connector_config


def test_readme_vllm_config_is_what_the_engine_tests_run() -> None:
    from vllm.config import KVTransferConfig

    cell = integration_rows()["vLLM"]
    m = re.fullmatch(r"--kv-transfer-config '(.*)'", cell)
    assert m, cell
    printed = json.loads(m.group(1))
    config = KVTransferConfig(**printed)
    assert config.kv_connector == "KVStoreConnector"
    assert config.kv_connector_module_path == "kvstore_vllm"
    ours = connector_config("127.0.0.1:2379")
    # the tests add short timeouts of their own; everything printed is what they use
    ours["kv_connector_extra_config"] = {"etcd": "127.0.0.1:2379"}
    assert printed == ours
    readme = (Path(__file__).resolve().parents[2] / "vllm_adapter" / "README.md").read_text()
    assert m.group(1) in readme[readme.index("## Run it"):]  # the `vllm serve` command it runs
