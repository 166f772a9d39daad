"""The admin CLI with credentials that do not match the cluster: the client library's
sentence (TlsMismatch, naming the file and the entry), not gRPC's handshake log and a
"did not answer ... is it running?"; a CA file that is gone is a typed error naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvstore.security.devca import ensure_dev_secrets
from tests.conftest import Cluster


def kvstore_with(creds: Path, *words: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVSTORE_TOKEN", "KVSTORE_TLS_CA", "KVSTORE_ADMIN_TOKEN")}
    env["KVSTORE_CREDENTIALS"] = str(creds)
    return subprocess.run([sys.executable, "-m", "kvstore", *words], capture_output=True,
                          text=True, timeout=120, env=env)


def test_stale_tls_credentials_against_a_plaintext_master(cluster: Cluster,
                                                          tmp_path: Path) -> None:
    sec = ensure_dev_secrets(tmp_path / "old-run")  # a secure run's CA, left behind
    creds = tmp_path / "credentials.json"
    entry = f"{cluster.etcd}/default"
    creds.write_text(json.dumps({entry: sec.client_credentials()}))
    run = kvstore_with(creds, "status", "--etcd", cluster.etcd)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "answers in plaintext, but this client connects with TLS" in run.stderr
    assert str(creds) in run.stderr and repr(entry) in run.stderr
    assert "did not answer" not in run.stderr
    assert "Handshake failed" not in run.stderr and "WRONG_VERSION_NUMBER" not in run.stderr

    # the CA file is gone (the data directory was removed): named, with its entry
    os.unlink(sec.ca)
    gone = kvstore_with(creds, "status", "--etcd", cluster.etcd)
    assert gone.returncode == 2, gone.stderr
    assert f"the CA file {sec.ca} named by \"tls_ca\" in the entry {entry!r}" in gone.stderr
    assert "Traceback" not in gone.stderr and "FileNotFoundError" not in gone.stderr
