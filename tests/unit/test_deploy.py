"""The deployment files (deploy/): they parse, validate offline, and agree with the real CLI.

Nothing here starts a daemon, a container or a cluster, and nothing touches the network
(an autouse fixture makes any socket connect fail): Kubernetes objects are checked against
the schemas that `kubernetes-validate` ships, and every daemon command line written in a
systemd unit, the compose file or a manifest is parsed by `kvstore.cli.build_parser()`.

Every deployment starts on the secure path: each daemon serves TLS and checks tokens
(--tls-cert/--tls-key/--auth-file, and --tls-ca/--token-file towards its peers), which
a daemon listening beyond loopback must have unless an explicit, commented --insecure
says otherwise; the files those flags name are where the deployment puts them; and the
certificates each deployment makes or documents verify for the names the daemons check.
"""

from __future__ import annotations

import argparse
import configparser
import ipaddress
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from kvstore.addresses import split_address
from kvstore.cli import build_parser
from kvstore.security.access import AccessList, Role
from kvstore.security.daemons import DaemonSecurity, is_loopback
from kvstore.units import parse_size

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
CERT_MANAGER = K8S / "cert-manager" / "certificates.yaml"
DEV_SECRETS = COMPOSE / "dev_secrets.py"
DASHBOARD = DEPLOY / "grafana" / "kvstore-dashboard.json"

K8S_VERSION = "1.30"
KVSTORE_BIN = "/usr/local/bin/kvstore"
UNITS = {"kvstore-master.service": "master", "kvstore-store.service": "store"}
ENV_FILE = SYSTEMD / "kvstore.env"

# The metrics the master exports, with their labels (besides Prometheus' own job/instance).
METRICS: dict[str, set[str]] = {
    "kvstore_master_rpc_seconds": {"method"},
    "kvstore_master_rpc_errors_total": {"method", "code"},
    "kvstore_master_is_leader": set(),
    "kvstore_master_quota_evictions_total": set(),
    "kvstore_tenant_bytes": {"tenant"},
    "kvstore_tenant_quota_bytes": {"tenant"},
    "kvstore_master_epoch": set(),
    "kvstore_master_objects": {"state"},
    "kvstore_master_object_bytes": {"state"},
    "kvstore_master_leases_active": set(),
    "kvstore_node_capacity_bytes": {"node", "tier"},
    "kvstore_node_used_bytes": {"node", "tier"},
    "kvstore_node_pinned_bytes": {"node", "tier"},
    "kvstore_master_lookups_total": set(),
    "kvstore_master_lookup_keys_total": set(),
    "kvstore_master_hit_keys_total": set(),
    "kvstore_master_leases_granted_total": set(),
    "kvstore_master_leases_expired_total": set(),
    "kvstore_master_leases_released_total": set(),
    "kvstore_master_evictions_total": set(),
    "kvstore_master_evicted_bytes_total": set(),
    "kvstore_master_reclaimed_pending_total": set(),
    "kvstore_master_put_failures_total": {"reason"},
    "kvstore_master_eviction_blocked_total": set(),
    "kvstore_master_eviction_blocked_bytes_total": set(),
    "kvstore_master_pin_capped_total": set(),
    "kvstore_master_pin_capped_keys_total": set(),
}
HISTOGRAMS = {"kvstore_master_rpc_seconds"}
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything here must work offline: fail loudly on any attempt to connect."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("test_deploy must not use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# --------------------------------------------------------------------------- helpers


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """Parse a daemon command line exactly as `kvstore` would, without running it."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse reports a bad flag by exiting 2
        pytest.fail(f"kvstore rejects this command line (exit {exc.code}): {argv}")


def check_daemon_args(args: argparse.Namespace, command: str) -> None:
    assert args.command == command
    assert args.log_level in {"debug", "info", "warning", "error"}
    assert re.fullmatch(r"[^\s:]+:\d+", args.etcd), args.etcd
    if command == "master":
        host, _, port = args.listen.rpartition(":")
        assert host and port.isdigit()
        # The master announces --listen in etcd; clients and store nodes dial it.
        assert host not in {"0.0.0.0", "::", "[::]"}, "--listen must be a reachable address"
        assert args.metrics_port > 0
    else:
        assert parse_size(args.dram) > 0
        assert args.host not in {"0.0.0.0", "::"}, "--host is announced to clients"
        assert args.protocol in {"tcp", "rdma"}


# The security flags a daemon of these deployments runs with, as argparse names them.
SECURITY_FILES = ("tls_cert", "tls_key", "tls_ca", "auth_file", "token_file")


def daemon_listens(args: argparse.Namespace) -> list[str]:
    """The addresses a daemon listens on, as it works them out (kvstore/master/daemon.py,
    kvstore/store/daemon.py): what check_exposure looks at."""
    if args.command == "master":
        return [args.listen, args.fast_listen or f"{split_address(args.listen)[0]}:0"]
    return [args.listen or f"{args.host}:0"]


def check_security(args: argparse.Namespace, where: str) -> None:
    """A daemon beyond loopback has TLS and an access file (or --insecure, which only
    check_insecure_is_commented may let through), and every daemon here is secure by
    default: TLS, tokens, and the CA and node token its peers need."""
    exposed = [a for a in daemon_listens(args) if not is_loopback(split_address(a)[0])]
    if exposed and not args.insecure:
        missing = [f for f in ("tls_cert", "tls_key", "auth_file") if not getattr(args, f)]
        assert not missing, f"{where}: listens on {exposed} without {missing} (the daemon refuses)"
    assert not args.insecure, f"{where}: --insecure in a default deployment"
    missing = [f"--{f.replace('_', '-')}" for f in SECURITY_FILES if not getattr(args, f)]
    assert not missing, f"{where}: not on the secure path, missing {missing}"
    assert not args.tls_client_ca or args.tls_cert


def security_paths(args: argparse.Namespace) -> dict[str, str]:
    return {f: getattr(args, f) for f in (*SECURITY_FILES, "tls_client_ca") if getattr(args, f)}


def check_insecure_is_commented(path: Path) -> None:
    """`--insecure` in a deployment file must come with a comment saying why: on its own
    line, or on a comment line right above it."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if "--insecure" not in code:
            continue
        above = lines[i - 1].strip() if i else ""
        assert "#" in line or above.startswith("#"), (
            f"{path.relative_to(ROOT)}:{i + 1}: --insecure without a comment saying why")


def fenced_blocks(text: str) -> Iterator[list[str]]:
    """The lines of each fenced code block (```...```) of a markdown text."""
    block: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                yield block
                block = None
        elif block is not None:
            block.append(line)


def check_readme_insecure(text: str, where: str) -> None:
    """A README may name `--insecure` in its prose (in backticks, saying when it is the
    right choice); a command it prints for copying passes it only with a comment saying
    why, as a deployment file must."""
    for n, block in enumerate(fenced_blocks(text), 1):
        for i, line in enumerate(block):
            code = line.split("#", 1)[0]
            if "--insecure" not in code:
                continue
            above = block[i - 1].strip() if i else ""
            assert "#" in line or above.startswith("#"), (
                f"{where}: code block {n} passes --insecure without a comment")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    bare = [m.start() for m in re.finditer(r"(?<!`)--insecure", prose)]
    assert not bare, f"{where}: --insecure outside backticks (at {bare})"


@pytest.mark.parametrize("path", sorted(p for p in DEPLOY.rglob("*") if p.is_file()),
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_insecure_is_never_silent(path: Path) -> None:
    if path.suffix == ".md":
        check_readme_insecure(path.read_text(), str(path.relative_to(ROOT)))
    elif path.suffix == ".json":
        # The dashboard is data for Grafana: it starts no daemon, so it has no business
        # passing --insecure, and it must still be JSON Grafana can load.
        assert isinstance(json.loads(path.read_text()), dict)
        assert "--insecure" not in path.read_text()
    else:
        check_insecure_is_commented(path)


def test_the_readme_check_catches_an_uncommented_insecure() -> None:
    with pytest.raises(AssertionError, match="code block 1 passes --insecure"):
        check_readme_insecure("Only on loopback: `--insecure`.\n```sh\nkvstore master --insecure\n```\n", "x")
    commented = "```sh\n# a lab without TLS, loopback only\nkvstore master --insecure\n```\n"
    with pytest.raises(AssertionError, match="outside backticks"):
        check_readme_insecure(commented + "then pass --insecure.\n", "x")
    check_readme_insecure(commented + "`--insecure` is for a lab.\n", "x")


def verify_server_cert(ca_pem: bytes, cert_pem: bytes, name: str) -> None:
    """RFC 5280 path validation (cryptography's verifier, as strict as Python 3.13's
    VERIFY_X509_STRICT): `cert` is a server certificate for `name`, signed by `ca`."""
    try:
        subject: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    ca = x509.load_pem_x509_certificate(ca_pem)
    leaf = x509.load_pem_x509_certificate(cert_pem)
    PolicyBuilder().store(Store([ca])).build_server_verifier(subject).verify(leaf, [])


def store_parser_knows(flag: str) -> bool:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return flag in sub.choices["store"]._option_string_actions


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in {".yaml", ".yml"})


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def test_deploy_tree_is_complete() -> None:
    expected = [
        "systemd/kvstore-master.service", "systemd/kvstore-store.service", "systemd/kvstore.env",
        "systemd/README.md", "compose/compose.yaml", "compose/Dockerfile", "compose/README.md",
        "compose/dev_secrets.py", "k8s/README.md", "k8s/cert-manager/certificates.yaml",
        "grafana/kvstore-dashboard.json",
    ]
    missing = [name for name in expected if not (DEPLOY / name).is_file()]
    assert not missing


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} holds no YAML document"
    assert all(isinstance(doc, dict) for doc in docs)


# --------------------------------------------------------------------------- systemd


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """systemd's own reading: every assignment kept (Environment= repeats), continuations
    (a trailing backslash) joined, comment lines dropped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not an assignment: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def read_env_file(path: Path, *, commented: bool = False) -> dict[str, str]:
    """An EnvironmentFile: KEY=VALUE lines. With commented=True, the commented-out
    examples ("# KEY=VALUE") instead."""
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if commented:
            m = re.fullmatch(r"#\s*([A-Z_][A-Z0-9_]*)=(.*)", line)
            if m:
                env[m[1]] = m[2]
            continue
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"bad env line {raw!r}"
        # systemd has no trailing comments: "X=1  # note" sets X to "1  # note".
        assert "#" not in value, f"{key}: a comment after a value becomes part of it"
        env[key] = shlex.split(value)[0] if value.startswith(("'", '"')) else value.strip()
    return env


def unit_environment(unit: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    """The Environment= defaults of a unit (each line may set several variables)."""
    env: dict[str, str] = {}
    for assignment in unit["Service"].get("Environment", []):
        for word in shlex.split(assignment):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def expand_exec(line: str, env: dict[str, str]) -> list[str]:
    """systemd's ExecStart= expansion: ${VAR} inside a word; a word that is exactly $VAR
    is split on whitespace (and vanishes when empty)."""
    assert "%" not in line, "specifiers in ExecStart are not expanded by this test"
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            assert whole[1] in env, f"${whole[1]} is set nowhere"
            argv.extend(env[whole[1]].split())
            continue

        def sub(m: re.Match[str]) -> str:
            assert m[1] in env, f"${{{m[1]}}} is set nowhere"
            return env[m[1]]

        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, word))
    return argv


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_unit_is_ini_with_required_keys(name: str) -> None:
    ini = configparser.ConfigParser(strict=False, interpolation=None)
    ini.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    ini.read(SYSTEMD / name)
    assert set(ini.sections()) == {"Unit", "Service", "Install"}
    assert ini["Unit"].get("Description")
    svc = ini["Service"]
    assert svc.get("Type") == "simple"
    assert svc.get("EnvironmentFile") == "/etc/kvstore/kvstore.env"
    assert svc.get("Restart") == "always"
    assert svc.get("User") == "kvstore"
    assert svc.get("ExecStart", "").split()[0] == KVSTORE_BIN
    assert svc.get("NoNewPrivileges") == "yes"
    assert svc.get("ProtectSystem") == "strict"
    assert ini["Install"].get("WantedBy") == "multi-user.target"

    unit = read_unit(SYSTEMD / name)
    # A crashed daemon must be restarted, forever (whatever its exit status).
    assert "3" not in " ".join(unit["Service"].get("RestartPreventExitStatus", []))
    assert unit["Unit"].get("StartLimitIntervalSec") == ["0"]
    if UNITS[name] == "master":
        # `systemctl reload` rereads the access file (the master's SIGHUP handler).
        assert unit["Service"]["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    else:
        # A store node has no SIGHUP handler: a reload would stop it.
        assert "ExecReload" not in unit["Service"]
    if UNITS[name] == "store":
        assert unit["Service"]["LimitMEMLOCK"] == ["infinity"]
        # Nothing that takes shared memory, RDMA devices or W+X pages from the store.
        for key in ("PrivateDevices", "MemoryDenyWriteExecute", "RemoveIPC", "PrivateIPC"):
            assert unit["Service"].get(key, ["no"])[-1] == "no", f"{key} breaks the store"
        assert "MemoryMax" not in unit["Service"] and "MemoryLimit" not in unit["Service"]
        # Any device allow-list (ProtectClock= implies one on systemd < 253) hides RDMA NICs.
        for key in ("DeviceAllow", "ProtectClock"):
            assert key not in unit["Service"], f"{key} can close /dev/infiniband"
        assert unit["Service"].get("DevicePolicy", ["auto"])[-1] == "auto"
        assert unit["Service"]["StateDirectory"] == ["kvstore"]  # /var/lib/kvstore


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_execstart_parses_with_the_cli(name: str) -> None:
    unit = read_unit(SYSTEMD / name)
    (exec_start,) = unit["Service"]["ExecStart"]
    defaults = unit_environment(unit)
    site = read_env_file(ENV_FILE)
    # With the example env file (it overrides Environment=), and with the defaults alone.
    for env in ({**defaults, **site}, defaults):
        argv = expand_exec(exec_start, env)
        assert argv[0] == KVSTORE_BIN
        args = parse_cli(argv[1:])
        check_daemon_args(args, UNITS[name])
        check_security(args, name)
        # The files live under /etc/kvstore, which ProtectSystem=strict leaves readable.
        for flag, path in security_paths(args).items():
            assert path.startswith("/etc/kvstore/"), f"{name}: --{flag} {path}"
    args = parse_cli(expand_exec(exec_start, {**defaults, **site})[1:])
    if UNITS[name] == "master":
        assert args.listen == site["KVSTORE_MASTER_LISTEN"]
        assert args.etcd == site["KVSTORE_ETCD"]
    else:
        assert args.dram == site["KVSTORE_STORE_DRAM"] and args.host == site["KVSTORE_STORE_HOST"]
    # The example addresses are not loopback: the exposure rule applies, and is met.
    assert not any(is_loopback(split_address(a)[0]) for a in daemon_listens(args))
    assert args.tls_cert == site["KVSTORE_TLS_CERT"] and args.auth_file == site["KVSTORE_AUTH_FILE"]
    assert args.token_file == site["KVSTORE_NODE_TOKEN_FILE"] and args.tls_ca == site["KVSTORE_TLS_CA"]
    assert args.tls_server_name == site["KVSTORE_TLS_SERVER_NAME"] == ""  # IP SANs, by default


def test_systemd_env_file_sets_every_variable_the_units_use() -> None:
    site = read_env_file(ENV_FILE)
    for name in UNITS:
        exec_start = read_unit(SYSTEMD / name)["Service"]["ExecStart"][0]
        used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", exec_start))
        assert used <= set(site), f"{name} uses {sorted(used - set(site))}, not in kvstore.env"


def test_systemd_env_file_sets_etcd_tls() -> None:
    """etcd's TLS is not a flag but the environment every process reads
    (kvstore/coord/etcd.py): the site file sets all three, to the host's files."""
    site = read_env_file(ENV_FILE)
    for var in ("KVSTORE_ETCD_CA", "KVSTORE_ETCD_CERT", "KVSTORE_ETCD_KEY"):
        assert site.get(var, "").startswith("/etc/kvstore/tls/"), var
    assert site["KVSTORE_ETCD_CA"] == site["KVSTORE_TLS_CA"]
    assert (site["KVSTORE_ETCD_CERT"], site["KVSTORE_ETCD_KEY"]) == (site["KVSTORE_TLS_CERT"],
                                                                    site["KVSTORE_TLS_KEY"])


def readme_block(path: Path, marker: str) -> str:
    """The fenced code block of a README that contains `marker`."""
    blocks = re.findall(r"```(?:sh|bash)\n(.*?)```", path.read_text(), flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_systemd_readme_openssl_commands_make_a_valid_chain(tmp_path: Path) -> None:
    """The README's CA and host certificate, made by the commands as written: the chain
    verifies (strictly: key identifiers, EKU) for the host's address and name."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed here")
    block = readme_block(SYSTEMD / "README.md", "openssl req")
    m = re.search(r"^host=(\S+) ip=(\S+)$", block, flags=re.M)
    assert m, "the README sets host= and ip= for the host certificate"
    host, ip = m[1], m[2]
    proc = subprocess.run(["sh", "-eu", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    ca, cert = (tmp_path / "ca.pem").read_bytes(), (tmp_path / f"{host}.pem").read_bytes()
    for name in (ip, host):
        verify_server_cert(ca, cert, name)
    leaf = x509.load_pem_x509_certificate(cert)
    usages = set(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages  # also its client certificate (etcd)
    assert oct((tmp_path / f"{host}.key").stat().st_mode & 0o777) == oct(0o600)  # umask 077
    # What the daemons do with it at start: load the certificate and key.
    DaemonSecurity.from_flags(tls_cert=str(tmp_path / f"{host}.pem"), tls_key=str(tmp_path / f"{host}.key"),
                              tls_ca=str(tmp_path / "ca.pem"))


def test_readme_token_recipe_makes_a_valid_access_file(tmp_path: Path) -> None:
    """systemd's and Kubernetes' READMEs build access.json from `kvstore token new`'s
    output with sed: the result loads, and each token file holds the token of its entry."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "kvstore").write_text(f"#!/bin/sh\nexec {sys.executable} -m kvstore \"$@\"\n")
    (bindir / "kvstore").chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    recipes = set()
    for readme in (SYSTEMD / "README.md", K8S / "README.md"):
        block = readme_block(readme, "kvstore token new --name nodes")
        lines = [line.split("#")[0].rstrip() for line in block.splitlines()]
        recipes.add("\n".join(line for line in lines if line and not line.startswith(
            ("install ", "kubectl ", "    --from-file"))))
    (recipe,) = recipes  # the same recipe in both, so one run checks both
    proc = subprocess.run(["sh", "-eu", "-c", recipe], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    access = AccessList.load(tmp_path / "access.json")
    roles = {access.authenticate((tmp_path / f"{t}.token").read_text().strip()).role
             for t in ("nodes", "ops", "vllm-a")}
    assert roles == {Role.NODE, Role.ADMIN, Role.CLIENT}
    assert access.authenticate((tmp_path / "vllm-a.token").read_text().strip()).tenant == "team-a"


def test_systemd_store_ssd_example_parses_into_an_ssd_tier() -> None:
    example = read_env_file(ENV_FILE, commented=True)["KVSTORE_STORE_EXTRA_ARGS"]
    assert "--ssd-dir" in example and store_parser_knows("--ssd-dir")
    unit = read_unit(SYSTEMD / "kvstore-store.service")
    env = {**unit_environment(unit), **read_env_file(ENV_FILE), "KVSTORE_STORE_EXTRA_ARGS": example}
    args = parse_cli(expand_exec(unit["Service"]["ExecStart"][0], env)[1:])
    check_daemon_args(args, "store")
    # The commented example, uncommented, gives the node the SSD tier it describes.
    assert args.ssd_dir == "/var/lib/kvstore/ssd" and parse_size(args.ssd) == 100 << 30


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` where the tool exists. It insists that ExecStart's binary
    exists, so the copies point at this Python interpreter instead of the real path."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here; the INI checks above still ran")
    paths = []
    for name in UNITS:
        text = (SYSTEMD / name).read_text().replace(KVSTORE_BIN, sys.executable)
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    proc = subprocess.run([tool, "verify", "--man=no", *paths], capture_output=True, text=True,
                          timeout=60, check=False)
    out = proc.stdout + proc.stderr
    # verify exits 0 after bad values ("Failed to parse ..., ignoring"): read its output.
    about_ours = [line for line in out.splitlines() if any(n in line for n in UNITS)]
    assert proc.returncode == 0 and not about_ours, out


# --------------------------------------------------------------------------- compose


def compose_interpolate(value: Any, env: dict[str, str], unset: set[str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} and $$, over the whole file."""
    if isinstance(value, dict):
        return {k: compose_interpolate(v, env, unset) for k, v in value.items()}
    if isinstance(value, list):
        return [compose_interpolate(v, env, unset) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        name = m[1] or m[4]
        if name in env and (env[name] or m[2] != ":-"):
            return env[name]
        if m[2]:
            return m[3]
        unset.add(name)
        return ""

    return re.sub(r"\$\$|\$\{(\w+)(?:(:?-)([^}]*))?\}|\$(\w+)", sub, value)


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    unset: set[str] = set()
    data = compose_interpolate(yaml.safe_load((COMPOSE / "compose.yaml").read_text()), env or {}, unset)
    assert not unset, f"variables without a default: {sorted(unset)}"
    return data


# The default (loopback), and the host's routable address (documentation example).
COMPOSE_HOSTS = [{}, {"KVSTORE_HOST": "192.0.2.5"}]


def kvstore_services(data: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    for name, svc in data["services"].items():
        cmd = svc.get("command")
        if isinstance(cmd, list) and cmd and cmd[0] == "kvstore":
            yield name, cmd


def test_compose_references_are_defined() -> None:
    data = compose()
    services = data["services"]
    volumes = set(data.get("volumes") or {})
    networks = set(data.get("networks") or {}) | {"default"}
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source = vol["source"] if isinstance(vol, dict) else vol.split(":")[0]
            if isinstance(vol, dict) and vol.get("type") not in (None, "volume"):
                continue
            if source.startswith(("/", ".", "~")):
                continue  # a bind mount
            assert source in volumes, f"{name} uses volume {source!r}, not defined"
        assert set(svc.get("networks") or []) <= networks, f"{name}: undefined network"
        assert set(svc.get("depends_on") or []) <= set(services), f"{name}: undefined dependency"
        if svc.get("network_mode") == "host":
            assert "ports" not in svc and "networks" not in svc, f"{name}: host network"
        build = svc.get("build")
        if build:
            context = (COMPOSE / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file()
            assert (context / "pyproject.toml").is_file()


@pytest.mark.parametrize("env", COMPOSE_HOSTS, ids=["loopback", "routable"])
def test_compose_services_and_ports(env: dict[str, str]) -> None:
    data = compose(env)
    assert data["services"]["etcd"]["image"].startswith("quay.io/coreos/etcd:v3.5")
    parsed = {name: parse_cli(cmd[1:]) for name, cmd in kvstore_services(data)}
    masters = {n: a for n, a in parsed.items() if a.command == "master"}
    stores = {n: a for n, a in parsed.items() if a.command == "store"}
    assert len(masters) == 2 and len(stores) == 2
    for name, args in parsed.items():
        check_daemon_args(args, args.command)
        check_security(args, f"compose {name}")
        assert data["services"][name].get("network_mode") == "host"
        assert data["services"][name]["restart"] in {"always", "unless-stopped"}
    # Host networking: every listening port is a host port, and none may repeat.
    ports = [int(a.listen.rpartition(":")[2]) for a in masters.values()]
    ports += [a.metrics_port for a in parsed.values() if a.metrics_port]
    etcd = " ".join(data["services"]["etcd"]["command"])
    ports += [int(p) for p in re.findall(r"--listen-[a-z]+-urls=\S*?:(\d+)", etcd)]
    assert len(ports) == len(set(ports)), f"a port is used twice: {sorted(ports)}"
    listen = {a.listen for a in masters.values()}
    assert len(listen) == 2, "the two masters need distinct --listen ports"
    assert len({a.node_id for a in stores.values()}) == 2
    client_url = re.search(r"--listen-client-urls=https://(\S+)", etcd)
    assert client_url and all(a.etcd == client_url[1] for a in parsed.values())
    host = env.get("KVSTORE_HOST", "127.0.0.1")
    assert all(a.listen.startswith(host + ":") for a in masters.values())
    assert all(a.host == host for a in stores.values())


def compose_files(svc: dict[str, Any]) -> dict[str, str]:
    """Volume name -> mount point, for the named volumes a service mounts."""
    out = {}
    for vol in svc.get("volumes", []):
        source, _, rest = vol.partition(":")
        if not source.startswith(("/", ".", "~")):
            out[source] = rest.split(":")[0]
    return out


def test_compose_etcd_and_daemons_use_tls() -> None:
    """etcd: TLS and client certificates on its client port; every kvstore container talks
    to it with the dev CA and a certificate, and mounts the secrets volume read-only."""
    data = compose()
    services = data["services"]
    etcd = services["etcd"]["command"]
    assert "--client-cert-auth" in etcd
    flags = dict(w.split("=", 1) for w in etcd if "=" in w)
    assert flags["--advertise-client-urls"].startswith("https://")
    for name in ("--cert-file", "--key-file", "--trusted-ca-file"):
        assert flags[name].startswith("/etc/kvstore/secrets/"), name
    health = " ".join(services["etcd"]["healthcheck"]["test"])
    assert "https://" in health and "--cacert=" in health and "--cert=" in health
    for svc in ("etcd", *(n for n, _ in kvstore_services(data))):
        deps = services[svc]["depends_on"]
        assert deps["dev-secrets"]["condition"] == "service_completed_successfully", svc
    for name, _ in kvstore_services(data):
        svc = services[name]
        assert compose_files(svc).get("secrets") == "/etc/kvstore", name
        assert any(v == "secrets:/etc/kvstore:ro" for v in svc["volumes"]), f"{name}: not read-only"
        env = svc["environment"]
        for var in ("KVSTORE_ETCD_CA", "KVSTORE_ETCD_CERT", "KVSTORE_ETCD_KEY"):
            assert env[var].startswith("/etc/kvstore/secrets/"), f"{name}: {var}"
    init = services["dev-secrets"]
    assert init["restart"] == "no" and init["user"] == "0:0"
    assert compose_files(init) == {"secrets": "/etc/kvstore"}
    assert any(v.startswith("./dev_secrets.py:/dev_secrets.py") for v in init["volumes"])


def run_dev_secrets(volume: Path, host: str) -> subprocess.CompletedProcess[str]:
    """compose's dev-secrets service, with the volume at `volume` (no --owner: not root)."""
    init = compose({"KVSTORE_HOST": host})["services"]["dev-secrets"]["command"]
    assert init[:2] == ["python", "/dev_secrets.py"]
    args = [a for a in init[2:] if not a.startswith(("--dir=", "--owner="))]
    return subprocess.run([sys.executable, str(DEV_SECRETS), f"--dir={volume}", *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


@pytest.mark.parametrize("env", COMPOSE_HOSTS, ids=["loopback", "routable"])
def test_compose_dev_secrets_make_what_the_daemons_load(tmp_path: Path, env: dict[str, str]) -> None:
    """Run dev_secrets.py as the init service would, then load what each daemon's flags
    and etcd name, the way the daemons do at start (certificate and key, access file,
    node token) and apply their exposure rule to the addresses they listen on."""
    host = env.get("KVSTORE_HOST", "127.0.0.1")
    proc = run_dev_secrets(tmp_path, host)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = compose(env)

    def local(path: str) -> str:
        assert path.startswith("/etc/kvstore/"), path
        return str(tmp_path / path.removeprefix("/etc/kvstore/"))

    etcd_flags = dict(w.split("=", 1) for w in data["services"]["etcd"]["command"] if "=" in w)
    ca = Path(local(etcd_flags["--trusted-ca-file"])).read_bytes()
    verify_server_cert(ca, Path(local(etcd_flags["--cert-file"])).read_bytes(), host)
    for name, cmd in kvstore_services(data):
        args = parse_cli(cmd[1:])
        files = {k: local(v) for k, v in security_paths(args).items()}
        for path in files.values():
            assert Path(path).is_file(), f"{name}: {path} is not made by dev_secrets.py"
        security = DaemonSecurity.from_flags(**files)
        security.check_exposure(*daemon_listens(args))
        assert security.access is not None and security.token
        assert security.access.authenticate(security.token).role is Role.NODE
        # The peers' certificate verifies for the address each daemon announces.
        announced = split_address(args.listen if args.command == "master" else f"{args.host}:0")[0]
        verify_server_cert(Path(files["tls_ca"]).read_bytes(), Path(files["tls_cert"]).read_bytes(),
                           announced)
        env_files = data["services"][name]["environment"]
        etcd_ca = Path(local(env_files["KVSTORE_ETCD_CA"])).read_bytes()
        assert etcd_ca == ca
        cert = x509.load_pem_x509_certificate(Path(local(env_files["KVSTORE_ETCD_CERT"])).read_bytes())
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
        creds = json.loads(Path(local(env_files["KVSTORE_CREDENTIALS"])).read_text())
        assert creds[f"{args.etcd}/{args.cluster}"]["admin_token"]
    # What README.md tells a client on the host to use.
    client = tmp_path / "client"
    for f in ("ca.pem", "client.token", "admin.token", "etcd.pem", "etcd.key"):
        assert (client / f).is_file(), f
    access = AccessList.load(tmp_path / "secrets" / "access.json")
    assert access.authenticate((client / "client.token").read_text().strip()).tenant == "dev"
    assert access.authenticate((client / "admin.token").read_text().strip()).role is Role.ADMIN
    etcd_client = x509.load_pem_x509_certificate((client / "etcd.pem").read_bytes())
    etcd_client.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    eku = set(etcd_client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert eku == {ExtendedKeyUsageOID.CLIENT_AUTH}, "the host's etcd certificate must not serve"
    for secret in ("server.key", "etcd-client.key", "node.token", "tokens.json", "credentials.json"):
        assert (tmp_path / "secrets" / secret).stat().st_mode & 0o077 == 0, secret


def test_compose_dev_secrets_keep_what_they_can(tmp_path: Path) -> None:
    """A second run keeps the CA and tokens (clients' copies stay valid) and the tokens an
    operator added; a new KVSTORE_HOST makes a new certificate that names it."""
    assert run_dev_secrets(tmp_path, "127.0.0.1").returncode == 0
    secrets = tmp_path / "secrets"
    before = {f: (secrets / f).read_bytes() for f in ("ca.pem", "server.pem", "tokens.json")}
    access = json.loads((secrets / "access.json").read_text())
    access["tenants"]["team-b"] = {"quota_bytes": 1 << 30}
    access["tokens"].append({"name": "vllm-b", "role": "client", "tenant": "team-b", "sha256": "b" * 64})
    (secrets / "access.json").write_text(json.dumps(access))
    assert run_dev_secrets(tmp_path, "127.0.0.1").returncode == 0
    assert {f: (secrets / f).read_bytes() for f in before} == before
    kept = AccessList.load(secrets / "access.json")
    assert "team-b" in kept.tenants and {p.name for p in kept.principals.values()} >= {"vllm-b", "dev-nodes"}
    proc = run_dev_secrets(tmp_path, "192.0.2.5")
    assert proc.returncode == 0 and "making a new CA" in proc.stdout
    verify_server_cert((secrets / "ca.pem").read_bytes(), (secrets / "server.pem").read_bytes(), "192.0.2.5")
    assert (secrets / "tokens.json").read_bytes() == before["tokens.json"]
    (secrets / "access.json").write_text("{not json")
    proc = run_dev_secrets(tmp_path, "192.0.2.5")
    assert proc.returncode == 2 and "not a valid access file" in proc.stdout


def test_dockerfile() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim-bookworm"
    assert re.search(r"apt-get install[^\n]*\n?[^\n]*libibverbs1", text)
    assert re.search(r"pip install [\"']?\.\[te\][\"']?", text)
    assert "torch" not in text.replace("without torch", "")
    for copied in re.findall(r"^COPY (\S+)", text, flags=re.M):
        assert (ROOT / copied).exists(), f"COPY {copied}: not in the repository"


# --------------------------------------------------------------------------- Kubernetes


def k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, doc) for p in sorted(K8S.glob("*.yaml")) for doc in load_all(p)]


def k8s_id(item: tuple[str, dict[str, Any]]) -> str:
    name, obj = item
    return f"{name}:{obj['kind']}/{obj.get('metadata', {}).get('name', '')}"


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [obj for _, obj in k8s_objects() if obj["kind"] == kind]


def check_service_monitor(sm: dict[str, Any]) -> None:
    """No built-in schema for this CRD: the fields Prometheus Operator requires, by hand."""
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) <= {"apiVersion", "kind", "metadata", "spec"}
    assert sm["metadata"]["name"] and sm["metadata"]["namespace"]
    spec = sm["spec"]
    assert isinstance(spec["selector"], dict) and spec["selector"].get("matchLabels")
    assert spec["endpoints"], "no endpoints to scrape"
    duration = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
    allowed = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
               "relabelings", "metricRelabelings", "params", "tlsConfig", "bearerTokenSecret"}
    for ep in spec["endpoints"]:
        assert set(ep) <= allowed, f"unknown endpoint fields {set(ep) - allowed}"
        assert isinstance(ep.get("port"), str) or "targetPort" in ep
        assert str(ep.get("path", "/metrics")).startswith("/")
        for key in ("interval", "scrapeTimeout"):
            if key in ep:
                assert duration.fullmatch(ep[key]), f"{key}: {ep[key]!r} is not a duration"
    if "namespaceSelector" in spec:
        assert set(spec["namespaceSelector"]) <= {"any", "matchNames"}
    # It must select a Service of ours, by a port name that Service has.
    services = [s for s in by_kind("Service")
                if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert services, "the ServiceMonitor selects no Service"
    names = {p.get("name") for s in services for p in s["spec"]["ports"]}
    assert {ep["port"] for ep in spec["endpoints"] if "port" in ep} <= names


def check_kustomization(obj: dict[str, Any]) -> None:
    others = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(obj["resources"]) == others


@pytest.mark.parametrize("item", k8s_objects(), ids=k8s_id)
def test_k8s_object_validates(item: tuple[str, dict[str, Any]]) -> None:
    _, obj = item
    if obj["kind"] == "ServiceMonitor":
        check_service_monitor(obj)
    elif obj["kind"] == "Kustomization":
        check_kustomization(obj)
    else:
        # strict: unknown fields are errors too (the schemas ship inside the package).
        error = ""
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:  # keep the schema dump out
            error = f"at {'.'.join(str(p) for p in exc.path)}: {exc.message}"
        assert not error, f"{k8s_id(item)} is invalid {error}"


def test_k8s_objects_agree() -> None:
    (ns,) = by_kind("Namespace")
    for _, obj in k8s_objects():
        if obj["kind"] not in {"Namespace", "Kustomization"}:
            assert obj["metadata"]["namespace"] == ns["metadata"]["name"], k8s_id(("", obj))
    configmaps = {c["metadata"]["name"] for c in by_kind("ConfigMap")}
    (deploy,) = by_kind("Deployment")
    (daemonset,) = by_kind("DaemonSet")
    assert deploy["spec"]["replicas"] == 2
    for workload in (deploy, daemonset):
        pod = workload["spec"]["template"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        for c in pod["spec"]["containers"]:
            for ref in c.get("envFrom", []):
                assert ref["configMapRef"]["name"] in configmaps
    # The master Service selects the master pods.
    (svc,) = [s for s in by_kind("Service") if s["metadata"]["name"] == "kvstore-master"]
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    # The readiness probe looks at the metrics port the master is told to serve.
    (master,) = deploy["spec"]["template"]["spec"]["containers"]
    probe = json.dumps(master["readinessProbe"])
    metrics_port = next(a for a in master["args"] if a.startswith("--metrics-port="))
    assert metrics_port.split("=")[1] in probe
    assert {p["containerPort"] for p in master["ports"]} >= {int(metrics_port.split("=")[1])}
    # The store: host network, the data volume, and room for the DRAM segment.
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    (store,) = spec["containers"]
    (data,) = [m for m in store["volumeMounts"] if m["mountPath"] == "/var/lib/kvstore"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == data["name"]]
    assert "hostPath" in volume or "persistentVolumeClaim" in volume
    (cm,) = by_kind("ConfigMap")
    dram = parse_size(cm["data"]["KVSTORE_STORE_DRAM"])
    limit = parse_size(store["resources"]["limits"]["memory"].replace("i", "iB"))
    assert limit > dram, "the memory limit must hold the DRAM segment (memfd is charged to it)"
    assert "IPC_LOCK" in store["securityContext"]["capabilities"]["add"]


FIELD_VALUES = {  # downward-API values for the substitution (documentation addresses)
    "status.podIP": "192.0.2.21", "status.hostIP": "192.0.2.31",
    "metadata.name": "kvstore-master-5d8f7-abcde", "spec.nodeName": "gpu-node-1",
}


def container_env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    cms = {c["metadata"]["name"]: c.get("data", {}) for c in by_kind("ConfigMap")}
    for ref in container.get("envFrom", []):
        env.update(cms[ref["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = FIELD_VALUES[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def k8s_expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command/args ($$ escapes a dollar)."""

    def sub(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        assert m[1] in env, f"$({m[1]}) is not in the container's environment"
        return env[m[1]]

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, word)


@pytest.mark.parametrize(("kind", "command"), [("Deployment", "master"), ("DaemonSet", "store")])
def test_k8s_args_parse_with_the_cli(kind: str, command: str) -> None:
    (workload,) = by_kind(kind)
    containers = [c for c in workload["spec"]["template"]["spec"]["containers"]
                  if c.get("command", [""])[0] == "kvstore"]
    assert len(containers) == 1
    (c,) = containers
    env = container_env(c)
    argv = [k8s_expand(w, env) for w in c["command"][1:] + c.get("args", [])]
    args = parse_cli(argv)
    check_daemon_args(args, command)
    check_security(args, f"{kind} {c['name']}")
    (cm,) = by_kind("ConfigMap")
    master_name = cm["data"]["KVSTORE_TLS_SERVER_NAME"]
    store_name = cm["data"]["KVSTORE_STORE_TLS_SERVER_NAME"]
    assert master_name != store_name, "a store node's certificate must not pass for a master's"
    if command == "master":
        assert args.listen.startswith(FIELD_VALUES["status.podIP"] + ":")
        # It dials store nodes at their node IP; their certificate names store_name.
        assert args.tls_server_name == store_name
        # `kubectl exec ... kvstore status`: the admin CLI finds the CA and the name.
        assert env["KVSTORE_TLS_SERVER_NAME"] == master_name
        assert env["KVSTORE_TLS_CA"] == args.tls_ca
    else:
        assert args.host == FIELD_VALUES["status.hostIP"]
        assert args.node_id == FIELD_VALUES["spec.nodeName"]
        assert args.tls_server_name == master_name
    # Pod and node IPs are not loopback: the exposure rule applies, and is met.
    assert not any(is_loopback(split_address(a)[0]) for a in daemon_listens(args))


def secret_mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Mount path -> Secret name, for the container's read-only Secret mounts."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for m in container.get("volumeMounts", []):
        secret = volumes[m["name"]].get("secret")
        if secret is not None:
            assert m.get("readOnly") is True, f"{m['name']} must be mounted read-only"
            assert "subPath" not in m, f"{m['name']}: a subPath mount is never updated"
            assert secret["defaultMode"] == 0o440, f"{m['name']}: keys readable by the pod's group only"
            out[m["mountPath"]] = secret["secretName"]
    return out


# What each Secret holds (README.md section 1; cert-manager fills the TLS ones).
SECRET_KEYS = {"kvstore-auth": {"access.json", "node.token"}}
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_k8s_security_files_are_mounted_secrets(kind: str) -> None:
    """Every file a security flag or KVSTORE_ETCD_* names is a key of a Secret mounted
    read-only there, readable by the daemons' user through fsGroup."""
    (workload,) = by_kind(kind)
    pod = workload["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = container_env(c)
    args = parse_cli([k8s_expand(w, env) for w in c["command"][1:] + c["args"]])
    user = c.get("securityContext", {}).get("runAsUser") or pod["securityContext"]["runAsUser"]
    assert pod["securityContext"]["fsGroup"] == user
    mounts = secret_mounts(pod, c)
    paths = {**{f"--{k.replace('_', '-')}": v for k, v in security_paths(args).items()},
             **{var: env[var] for var in ("KVSTORE_ETCD_CA", "KVSTORE_ETCD_CERT", "KVSTORE_ETCD_KEY")}}
    if "KVSTORE_TLS_CA" in env:
        paths["KVSTORE_TLS_CA"] = env["KVSTORE_TLS_CA"]
    for what, path in paths.items():
        directory, _, key = path.rpartition("/")
        assert directory in mounts, f"{kind}: {what}={path} is not in a Secret mount"
        secret = mounts[directory]
        assert key in SECRET_KEYS.get(secret, TLS_KEYS), f"{kind}: {secret} has no key {key}"
    # The daemon's own certificate, its peers' CA and the key come from one TLS Secret.
    assert len({mounts[p.rpartition("/")[0]] for p in (args.tls_cert, args.tls_key, args.tls_ca)}) == 1


def cert_manager_objects() -> list[dict[str, Any]]:
    return load_all(CERT_MANAGER)


def test_k8s_cert_manager_objects() -> None:
    """No built-in schema for cert-manager's CRDs: the fields they require, by hand, and
    that the certificates are the ones the pods mount, for the names the daemons check."""
    objs = cert_manager_objects()
    issuers = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterIssuer"}
    certs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
    assert {o["kind"] for o in objs} == {"ClusterIssuer", "Certificate"}
    duration = re.compile(r"(\d+h)?(\d+m)?(\d+s)?")
    usages = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign"}
    for o in objs:
        assert o["apiVersion"] == "cert-manager.io/v1"
        assert set(o) == {"apiVersion", "kind", "metadata", "spec"}
    for issuer in issuers.values():
        assert set(issuer["spec"]) in ({"selfSigned"}, {"ca"})
        assert "namespace" not in issuer["metadata"]
    for name, cert in certs.items():
        spec = cert["spec"]
        assert cert["metadata"]["namespace"] and spec["secretName"]
        ref = spec["issuerRef"]
        assert ref["kind"] == "ClusterIssuer" and ref["group"] == "cert-manager.io"
        assert ref["name"] in issuers, f"{name}: no ClusterIssuer {ref['name']}"
        for key in ("duration", "renewBefore"):
            if key in spec:
                assert duration.fullmatch(spec[key]), f"{name}: {key}"
        assert set(spec.get("usages", [])) <= usages, name
        assert spec["privateKey"]["algorithm"] in {"RSA", "ECDSA", "Ed25519"}
    # The CA: self-signed, its Secret where a ClusterIssuer reads it (cert-manager's namespace).
    (ca_issuer,) = [i for i in issuers.values() if "ca" in i["spec"]]
    (ca,) = [c for c in certs.values() if c["spec"].get("isCA")]
    assert ca["metadata"]["namespace"] == "cert-manager"
    assert ca["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
    assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]
    # Every TLS Secret a pod mounts is a Certificate in the kvstore namespace.
    (ns,) = by_kind("Namespace")
    mounted = set()
    for kind in ("Deployment", "DaemonSet"):
        (workload,) = by_kind(kind)
        pod = workload["spec"]["template"]["spec"]
        mounted |= set(secret_mounts(pod, pod["containers"][0]).values())
    by_secret = {c["spec"]["secretName"]: c for c in certs.values()
                 if c["metadata"]["namespace"] == ns["metadata"]["name"]}
    assert mounted - set(SECRET_KEYS) <= set(by_secret), "a mounted TLS Secret has no Certificate"
    (cm,) = by_kind("ConfigMap")
    for secret, var in (("kvstore-master-tls", "KVSTORE_TLS_SERVER_NAME"),
                        ("kvstore-store-tls", "KVSTORE_STORE_TLS_SERVER_NAME")):
        spec = by_secret[secret]["spec"]
        assert spec["dnsNames"] == [cm["data"][var]], f"{secret} must name {var} (configmap.yaml)"
        assert {"server auth", "client auth"} <= set(spec["usages"])
    assert set(by_secret["kvstore-etcd-client"]["spec"]["usages"]) == {"digital signature", "client auth"}
    # etcd's certificate names the endpoint the pods dial.
    (etcd,) = [c for c in certs.values() if c["metadata"]["namespace"] != ns["metadata"]["name"]
               and not c["spec"].get("isCA")]
    assert split_address(cm["data"]["KVSTORE_ETCD"])[0] in etcd["spec"]["dnsNames"]


def test_k8s_readme_says_how_to_make_every_secret() -> None:
    readme = (K8S / "README.md").read_text()
    made_by_cert_manager = {c["spec"]["secretName"] for c in cert_manager_objects()
                            if c["kind"] == "Certificate"}
    for kind in ("Deployment", "DaemonSet"):
        (workload,) = by_kind(kind)
        pod = workload["spec"]["template"]["spec"]
        for secret in secret_mounts(pod, pod["containers"][0]).values():
            assert f"`{secret}`" in readme, f"README.md does not mention Secret {secret}"
            by_kubectl = re.search(rf"create secret generic (kvstore-\$s-tls|{secret})\b", readme)
            assert secret in made_by_cert_manager or by_kubectl, secret
            if secret not in made_by_cert_manager:
                assert by_kubectl, f"README.md has no `kubectl create secret` for {secret}"


# --------------------------------------------------------------------------- Grafana


def dashboard_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from dashboard_panels(p.get("panels", []))


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard_panels(dash["panels"]) for t in p.get("targets", [])]
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def metric_base(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and dash["schemaVersion"] >= 30
    panels = list(dashboard_panels(dash["panels"]))
    assert len({p["id"] for p in panels}) == len(panels), "panel ids repeat"
    exprs = dashboard_exprs(dash)
    assert exprs
    for p in panels:
        if p["type"] != "row":
            assert p["targets"] and all(t.get("expr") for t in p["targets"]), p["title"]
            assert p["datasource"]["uid"] == "${datasource}"
    for expr in exprs:
        names = re.findall(r"\bkvstore_[a-z0-9_]+\b", expr)
        assert names, f"no kvstore metric in {expr!r}"
        bases = {metric_base(n) for n in names}
        assert bases <= set(METRICS), f"unknown metrics {bases - set(METRICS)} in {expr!r}"
        for name in names:
            if name in HISTOGRAMS:
                pytest.fail(f"{name} is a histogram: use _bucket/_count/_sum in {expr!r}")
        labels = set().union(*(METRICS[b] for b in bases)) | TARGET_LABELS | {"le"}
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            used = {x.strip() for x in clause.split(",") if x.strip()}
            assert used <= labels, f"labels {used - labels} do not exist in {expr!r}"
        for metric, matchers in re.findall(r"\b(kvstore_[a-z0-9_]+)\{([^}]*)\}", expr):
            used = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
            allowed = METRICS[metric_base(metric)] | TARGET_LABELS
            assert used <= allowed, f"{metric} has no label {used - allowed}"
        m = re.search(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", expr)
        if m:
            assert m[2] in METRICS[metric_base(m[1])]


def test_grafana_dashboard_has_the_panels() -> None:
    exprs = " ".join(dashboard_exprs(json.loads(DASHBOARD.read_text())))
    assert "kvstore_node_used_bytes" in exprs and "kvstore_node_pinned_bytes" in exprs
    assert re.search(r"rate\(kvstore_master_hit_keys_total\[[^]]+\]\)\)\s*/\s*"
                     r"sum\(rate\(kvstore_master_lookup_keys_total", exprs)
    assert "rate(kvstore_master_evictions_total[" in exprs
    assert re.search(r"histogram_quantile\(0\.99,\s*sum by \(le, method\) "
                     r"\(rate\(kvstore_master_rpc_seconds_bucket", exprs)
    assert "kvstore_master_is_leader" in exprs and "kvstore_master_epoch" in exprs


def test_metric_list_matches_what_the_master_exports() -> None:
    """The list the dashboard is checked against is the master's real exposition."""
    from prometheus_client import generate_latest

    from kvstore.master.core import MasterCore
    from kvstore.master.metrics import MasterMetrics

    metrics = MasterMetrics()
    metrics.watch_core(MasterCore().stats, lambda: True, lambda: 1)
    exported = set()
    for line in generate_latest(metrics.registry).decode().splitlines():
        m = re.fullmatch(r"# TYPE (\S+) (\S+)", line)
        if m:
            name, kind = m[1], m[2]
            exported.add(name if kind != "counter" or name.endswith("_total") else name + "_total")
    assert exported == set(METRICS)
