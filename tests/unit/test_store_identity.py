"""A store node's identity kept in its data directories (kvstore.store.identity)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.errors import AlreadyExists, InvalidArgument
from kvstore.store.identity import IDENTITY_FILE, claim


def test_first_start_records_a_new_id_and_a_restart_reuses_it(tmp_path: Path) -> None:
    first = claim([str(tmp_path)], "c1")
    first.release()
    assert json.loads((tmp_path / IDENTITY_FILE).read_text())["node_id"] == first.node_id
    again = claim([str(tmp_path)], "c1")
    again.release()
    assert again.node_id == first.node_id and again.recorded == first.node_id


def test_node_id_flag_overrides_and_is_recorded(tmp_path: Path) -> None:
    claim([str(tmp_path)], "c1").release()
    forced = claim([str(tmp_path)], "c1", "chosen")
    forced.release()
    assert forced.node_id == "chosen"
    assert claim([str(tmp_path)], "c1").node_id == "chosen"


def test_no_directories_means_a_random_id_each_time() -> None:
    a, b = claim([], "c1"), claim([], "c1")
    assert a.node_id != b.node_id
    assert claim(["", ""], "c1", "given").node_id == "given"


def test_another_clusters_directory_is_refused(tmp_path: Path) -> None:
    claim([str(tmp_path)], "prod", "n1").release()
    with pytest.raises(InvalidArgument, match="belongs to node 'n1' of cluster 'prod'"):
        claim([str(tmp_path)], "staging")
    assert json.loads((tmp_path / IDENTITY_FILE).read_text())["cluster"] == "prod"


def test_a_held_directory_is_refused_and_freed_when_its_holder_dies(tmp_path: Path) -> None:
    held = claim([str(tmp_path)], "c1")
    with pytest.raises(AlreadyExists, match=f"in use by another store node \\(pid {os.getpid()}"):
        claim([str(tmp_path)], "c1")
    held.release()
    claim([str(tmp_path)], "c1").release()
    # A process killed with SIGKILL cannot release anything: the kernel does.
    code = ("import sys, time; from kvstore.store.identity import claim; "
            f"claim([{str(tmp_path)!r}], 'c1'); print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(AlreadyExists, match=f"pid {child.pid}"):
            claim([str(tmp_path)], "c1")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    claim([str(tmp_path)], "c1").release()


def test_directories_of_two_nodes_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    claim([str(a)], "c1", "node-a").release()
    claim([str(b)], "c1", "node-b").release()
    with pytest.raises(InvalidArgument, match="belong to different nodes"):
        claim([str(a), str(b)], "c1")
    # a new directory next to a recorded one takes its id
    c = tmp_path / "c"
    both = claim([str(a), str(c)], "c1")
    both.release()
    assert both.node_id == "node-a"
    assert json.loads((c / IDENTITY_FILE).read_text())["node_id"] == "node-a"


def test_a_damaged_identity_file_is_refused_with_the_way_out(tmp_path: Path) -> None:
    (tmp_path / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(InvalidArgument, match=r"damaged.*delete it"):
        claim([str(tmp_path)], "c1")
