"""A development CA for `kvstore up`: so that the secure path is the default path.

Makes, once, under the cluster's data directory: a CA, a server certificate for the
loopback names signed by it, and three tokens (a client of tenant "dev", an admin, and
the node token the master and store nodes use with each other), plus the access file
the daemons load. Later runs reuse them, so a client's credentials survive restarts.
Nothing here is meant for production: the README says how to bring your own.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvstore.security.access import new_token, token_hash

DEV_TENANT = "dev"
DEV_QUOTA = 0  # no quota in development


@dataclass(frozen=True)
class DevSecrets:
    dir: Path
    ca: Path
    cert: Path
    key: Path
    access: Path
    client_token: str
    admin_token: str
    node_token_file: Path

    def client_credentials(self) -> dict[str, str]:
        return {"token": self.client_token, "admin_token": self.admin_token,
                "tls_ca": str(self.ca)}


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca_and_cert(out: Path, names: list[str], days: int = 825) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for `names` (DNS names or IP addresses)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("kvstore dev CA")).issuer_name(_name("kvstore dev CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        # Key identifiers: Python >= 3.13 verifies strictly (VERIFY_X509_STRICT) and
        # refuses a chain without them.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                       critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0])).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "ca.pem", out / "server.pem", out / "server.key")
    _write(paths[0], ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths[1], cert.public_bytes(serialization.Encoding.PEM))
    _write(paths[2], _pem_key(key), private=True)
    return paths


def ensure_dev_secrets(data_dir: Path) -> DevSecrets:
    """Create (first run) or reuse the dev CA, certificate, tokens and access file."""
    d = data_dir / "secrets"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    ca, cert, key = d / "ca.pem", d / "server.pem", d / "server.key"
    tokens_file = d / "tokens.json"
    if not (ca.exists() and cert.exists() and key.exists()):
        make_ca_and_cert(d, ["127.0.0.1", "localhost", "::1", socket.gethostname()])
    tokens: dict[str, str] = {}
    if tokens_file.exists():
        try:
            tokens = json.loads(tokens_file.read_text())
        except ValueError:
            tokens = {}
    for role in ("client", "admin", "node"):
        tokens.setdefault(role, new_token())
    _write(tokens_file, json.dumps(tokens, indent=2).encode(), private=True)
    node_token_file = d / "node.token"
    _write(node_token_file, tokens["node"].encode(), private=True)
    access = {
        "tenants": {DEV_TENANT: {"quota_bytes": DEV_QUOTA}},
        "tokens": [
            {"name": "dev-client", "role": "client", "tenant": DEV_TENANT,
             "sha256": token_hash(tokens["client"])},
            {"name": "dev-admin", "role": "admin", "sha256": token_hash(tokens["admin"])},
            {"name": "dev-nodes", "role": "node", "sha256": token_hash(tokens["node"])},
        ],
    }
    access_file = d / "access.json"
    _write(access_file, json.dumps(access, indent=2).encode())
    return DevSecrets(d, ca, cert, key, access_file, tokens["client"], tokens["admin"],
                      node_token_file)


def write_credentials(path: Path, cluster: str, creds: dict[str, str]) -> None:
    """Set the entry `cluster` ("ETCD/CLUSTER") of the credentials file, keeping the others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _entries(path)
    data[cluster] = creds
    _write(path, json.dumps(data, indent=2).encode(), private=True)


def remove_credentials(path: Path, cluster: str) -> bool:
    """Delete the entry `cluster` of the credentials file, keeping the others; True if
    there was one. A cluster started without TLS must not leave clients a CA (and a
    token) from a secure run on the same endpoint: they would try TLS against it."""
    data = _entries(path)
    if cluster not in data:
        return False
    del data[cluster]
    _write(path, json.dumps(data, indent=2).encode(), private=True)
    return True


def _entries(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
