"""The `dev-secrets` service of compose.yaml: a development CA, certificates and tokens.

Runs once before etcd and the daemons start (as root, so that it can hand the files to
the image's kvstore user) and writes, into the `secrets` volume:

    secrets/ca.pem                    the dev CA (its key is thrown away once it has signed)
    secrets/server.pem, server.key    what etcd, the masters and the store nodes serve (SANs:
                                      loopback, this host's name, --host); also their client
                                      certificate towards each other and etcd
    secrets/etcd-client.pem, .key     a client-only certificate for etcd (--client-cert-auth),
                                      for clients on the host: they get no daemon's key
    secrets/access.json               the access file: tenant "dev", a client, an admin and
                                      the node token, as SHA-256 only
    secrets/tokens.json, node.token   the tokens themselves
    secrets/credentials.json          what `kvstore status` inside a container reads
    client/                           what a client on the host needs (README.md)

A later run keeps everything (so clients' copies stay valid) unless the certificate lacks
a name asked for, e.g. after KVSTORE_HOST changed. The tokens and access file come from
kvstore.security.devca, as `kvstore up` makes its own; tenants and tokens an operator added
to access.json are kept. The certificates are made here, with
the key identifiers that Python >= 3.13 requires of a chain (ssl.VERIFY_X509_STRICT).
Development only: with a real PKI, give the daemons your own files
(deploy/systemd/README.md shows how).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvstore.errors import KVStoreError
from kvstore.security.access import AccessList
from kvstore.security.devca import DEV_TENANT, ensure_dev_secrets, write_credentials

DAYS = 825


def cert_names(path: Path) -> set[str]:
    """The DNS names and IP addresses a PEM certificate is valid for."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return set()
    return {str(n) for n in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName))


def normal(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return name


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def make_certificates(d: Path, names: list[str]) -> None:
    """ca.pem; server.pem/.key for `names` (server and client use); etcd-client.pem/.key."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("kvstore compose dev CA")).issuer_name(_name("kvstore compose dev CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                       critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, sans: list[str], usages: list[x509.ObjectIdentifier]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
        )
        if sans:
            general: list[x509.GeneralName] = []
            for n in sans:
                try:
                    general.append(x509.IPAddress(ipaddress.ip_address(n)))
                except ValueError:
                    general.append(x509.DNSName(n))
            b = b.add_extension(x509.SubjectAlternativeName(general), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cert.public_bytes(serialization.Encoding.PEM), pem_key

    d.mkdir(parents=True, exist_ok=True)
    server = leaf(names[0], names, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    # CN kvstore-client: with etcd's auth on (`kvstore etcd-setup`) etcd takes the CN as
    # the user, whose role reads the leader's record and nothing else.
    client = leaf("kvstore-client", [], [ExtendedKeyUsageOID.CLIENT_AUTH])
    _write(d / "server.key", server[1])
    _write(d / "server.pem", server[0])
    _write(d / "etcd-client.key", client[1])
    _write(d / "etcd-client.pem", client[0])
    _write(d / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))


def keep_extra_entries(access: Path, kept: dict[str, Any]) -> None:
    """ensure_dev_secrets writes the dev tenant and tokens only: add back the tenants and
    tokens an operator put into the access file since (README.md, Security)."""
    if not kept:
        return
    fresh = json.loads(access.read_text())
    names = {t.get("name") for t in fresh["tokens"]}
    fresh["tenants"] = {**kept.get("tenants", {}), **fresh["tenants"]}
    fresh["tokens"] += [t for t in kept.get("tokens", []) if t.get("name") not in names]
    AccessList.parse(fresh, str(access))
    _write(access, json.dumps(fresh, indent=2).encode())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--dir", required=True, help="the volume: files go to DIR/secrets and DIR/client")
    p.add_argument("--host", default="127.0.0.1", help="the address the daemons announce")
    p.add_argument("--etcd", default="127.0.0.1:2379", help="etcd HOST:PORT (names the credentials)")
    p.add_argument("--cluster", default="default")
    p.add_argument("--owner", default="", help="UID:GID to give the files to (the daemons' user)")
    args = p.parse_args(argv)

    os.umask(0o077)  # keys and tokens are never readable by others, not even for a moment
    root = Path(args.dir)
    d = root / "secrets"
    names = list(dict.fromkeys(
        normal(n) for n in ["127.0.0.1", "localhost", "::1", socket.gethostname(), args.host] if n))
    files = ["ca.pem", "server.pem", "server.key", "etcd-client.pem", "etcd-client.key"]
    if not (all((d / f).exists() for f in files) and set(names) <= cert_names(d / "server.pem")):
        if (d / "server.pem").exists():
            missing = sorted(set(names) - cert_names(d / "server.pem"))
            print(f"dev-secrets: the certificate does not name {missing}: making a new CA; "
                  "copy the client files again (README.md)")
        make_certificates(d, names)
    access = d / "access.json"
    try:
        kept = json.loads(access.read_text()) if access.exists() else {}
        AccessList.parse(kept or {}, str(access))
    except (ValueError, KVStoreError) as exc:
        print(f"dev-secrets: {access} is not a valid access file, fix it: {exc}")
        return 2
    dev = ensure_dev_secrets(root)  # finds the certificate above; makes tokens and access file
    keep_extra_entries(access, kept)
    write_credentials(d / "credentials.json", f"{args.etcd}/{args.cluster}",
                      {**dev.client_credentials(), "tls_ca": str(dev.ca)})

    client = root / "client"
    client.mkdir(exist_ok=True)
    for src, dst in (("ca.pem", "ca.pem"), ("etcd-client.pem", "etcd.pem"), ("etcd-client.key", "etcd.key")):
        shutil.copyfile(d / src, client / dst)
    (client / "client.token").write_text(dev.client_token + "\n")
    (client / "admin.token").write_text(dev.admin_token + "\n")

    for path in [root, *root.rglob("*")]:
        public = path.suffix == ".pem" or path.name == "access.json"
        os.chmod(path, (0o644 if public else 0o600) if path.is_file() else 0o700)
        if args.owner:
            uid, _, gid = args.owner.partition(":")
            os.chown(path, int(uid), int(gid or uid))
    print(f"dev-secrets: {d} ready; the certificate names {', '.join(sorted(cert_names(dev.cert)))}; "
          f"client files in {client} (tenant {DEV_TENANT!r})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
