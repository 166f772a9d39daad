"""The deployment files (deploy/): they parse, validate offline, and agree with the real CLI.

Nothing here starts a daemon, a container or a cluster, and nothing touches the network
(an autouse fixture makes any socket connect fail): Kubernetes objects are checked against
the schemas that `kubernetes-validate` ships, and every daemon command line written in a
systemd unit, the compose file or a manifest is parsed by `kvstore.cli.build_parser()`.
"""

from __future__ import annotations

import argparse
import configparser
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

from kvstore.cli import build_parser
from kvstore.units import parse_size

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
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
        "k8s/README.md", "grafana/kvstore-dashboard.json",
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
    # A master that loses leadership exits 3: that must restart it, forever.
    assert "3" not in " ".join(unit["Service"].get("RestartPreventExitStatus", []))
    assert unit["Unit"].get("StartLimitIntervalSec") == ["0"]
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
    args = parse_cli(expand_exec(exec_start, {**defaults, **site})[1:])
    if UNITS[name] == "master":
        assert args.listen == site["KVSTORE_MASTER_LISTEN"]
        assert args.etcd == site["KVSTORE_ETCD"]
    else:
        assert args.dram == site["KVSTORE_STORE_DRAM"] and args.host == site["KVSTORE_STORE_HOST"]


def test_systemd_env_file_sets_every_variable_the_units_use() -> None:
    site = read_env_file(ENV_FILE)
    for name in UNITS:
        exec_start = read_unit(SYSTEMD / name)["Service"]["ExecStart"][0]
        used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", exec_start))
        assert used <= set(site), f"{name} uses {sorted(used - set(site))}, not in kvstore.env"


def test_systemd_store_ssd_example_parses_once_the_cli_has_it() -> None:
    example = read_env_file(ENV_FILE, commented=True)["KVSTORE_STORE_EXTRA_ARGS"]
    assert "--ssd-dir" in example
    if not store_parser_knows("--ssd-dir"):
        pytest.skip("`kvstore store` has no --ssd-dir yet (the SSD tier's CLI is not merged)")
    unit = read_unit(SYSTEMD / "kvstore-store.service")
    env = {**unit_environment(unit), **read_env_file(ENV_FILE), "KVSTORE_STORE_EXTRA_ARGS": example}
    parse_cli(expand_exec(unit["Service"]["ExecStart"][0], env)[1:])


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


def compose() -> dict[str, Any]:
    unset: set[str] = set()
    data = compose_interpolate(yaml.safe_load((COMPOSE / "compose.yaml").read_text()), {}, unset)
    assert not unset, f"variables without a default: {sorted(unset)}"
    return data


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


def test_compose_services_and_ports() -> None:
    data = compose()
    assert data["services"]["etcd"]["image"].startswith("quay.io/coreos/etcd:v3.5")
    parsed = {name: parse_cli(cmd[1:]) for name, cmd in kvstore_services(data)}
    masters = {n: a for n, a in parsed.items() if a.command == "master"}
    stores = {n: a for n, a in parsed.items() if a.command == "store"}
    assert len(masters) == 2 and len(stores) == 2
    for name, args in parsed.items():
        check_daemon_args(args, args.command)
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
    client_url = re.search(r"--listen-client-urls=http://(\S+)", etcd)
    assert client_url and all(a.etcd == client_url[1] for a in parsed.values())


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
    if command == "master":
        assert args.listen.startswith(FIELD_VALUES["status.podIP"] + ":")
    else:
        assert args.host == FIELD_VALUES["status.hostIP"]
        assert args.node_id == FIELD_VALUES["spec.nodeName"]


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
