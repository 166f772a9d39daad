"""The deployment files run etcd with its auth on (issue 29): offline checks.

Compose has an `etcd-setup` service that runs `kvstore etcd-setup` before any daemon, and
the daemons log in as the daemon user with the password file that service writes; the
host's etcd certificate is named for the reader role. Kubernetes has a Job that runs
`kvstore etcd-setup` with etcd's root password from a Secret, and the pods' etcd
certificate is named for the daemon role (etcd takes the CN as the user).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from kvstore.coord.etcd_auth import Roles
from tests.unit.test_deploy import COMPOSE, K8S, compose, k8s_expand, load_all, parse_cli

ROLES = Roles.of("default")
ROOT = Path(__file__).resolve().parents[2]


def test_compose_sets_up_etcd_auth_before_the_daemons() -> None:
    services = compose()["services"]
    setup = services["etcd-setup"]
    assert setup["restart"] == "no"
    assert setup["depends_on"]["etcd"]["condition"] == "service_healthy"
    script = setup["command"][-1]
    argv = script.split("&&")[0].split()
    assert argv[0] == "kvstore"
    args = parse_cli(argv[1:])
    assert args.command == "etcd-setup" and args.cluster == "default"
    assert any(v == "secrets:/etc/kvstore" for v in setup["volumes"])  # it writes there
    daemons = [n for n, s in services.items()
               if isinstance(s.get("command"), list) and s["command"][:1] == ["kvstore"]]
    assert len(daemons) == 4
    for name in daemons:
        svc = services[name]
        assert svc["depends_on"]["etcd-setup"]["condition"] == "service_completed_successfully"
        env = svc["environment"]
        assert env["KVSTORE_ETCD_USER"] == ROLES.daemon
        assert env["KVSTORE_ETCD_PASSWORD_FILE"] == f"{args.secrets}/{ROLES.daemon}.password"


def test_compose_host_etcd_certificate_is_the_reader(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(COMPOSE / "dev_secrets.py"), f"--dir={tmp_path}",
                          "--host=127.0.0.1", "--etcd=127.0.0.1:2379"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    cert = x509.load_pem_x509_certificate((tmp_path / "client" / "etcd.pem").read_bytes())
    (cn,) = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert cn.value == ROLES.reader


def test_k8s_job_runs_etcd_setup_with_roots_secret() -> None:
    (job,) = [o for o in load_all(K8S / "etcd-setup.yaml") if o["kind"] == "Job"]
    assert "etcd-setup.yaml" in yaml.safe_load((K8S / "kustomization.yaml").read_text())[
        "resources"]
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (config,) = [o for o in load_all(K8S / "configmap.yaml") if o["kind"] == "ConfigMap"]
    env = {**config["data"], **{e["name"]: e["value"] for e in c["env"]}}
    args = parse_cli([k8s_expand(w, env) for w in c["command"][1:] + c["args"]])
    assert args.command == "etcd-setup"
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args.root_password_file == f"{mounts['etcd-root']}/password"
    assert secrets["etcd-root"] == "kvstore-etcd-root"
    assert secrets["etcd-client"] == "kvstore-etcd-client"
    assert "`kvstore-etcd-root`" in (K8S / "README.md").read_text()


def test_k8s_pods_etcd_certificate_is_the_daemon() -> None:
    certs = {o["metadata"]["name"]: o for o in load_all(K8S / "cert-manager" / "certificates.yaml")
             if o["kind"] == "Certificate"}
    assert certs["kvstore-etcd-client"]["spec"]["commonName"] == ROLES.daemon
