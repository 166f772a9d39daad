"""`kvstore etcd-setup`: etcd's users and roles for a cluster, then etcd's auth on.

Run once per cluster by the operator, against the etcd the cluster will use (see
kvstore.coord.etcd_auth for the roles and docs/operations.md for why). The passwords
live in `--secrets DIR`, one file per user (`root.password`, `kvstore-daemon.password`,
`kvstore-client.password`), mode 0600: a file already there is used as it is, so a second
run changes nothing, and a missing one gets a new random password (root's may come from
`--root-password-file` instead). The command prints the environment each kind of process
needs. Where etcd takes client certificates (`--client-cert-auth`), it names the user by
the certificate's CN, so certificates for CN `kvstore-daemon` and `kvstore-client` need
no password at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
from pathlib import Path
from typing import Any

from kvstore.admin.output import emit_json
from kvstore.coord.etcd_auth import ROOT, Roles, set_up
from kvstore.errors import InvalidArgument


def _password(directory: Path, user: str) -> str:
    path = directory / f"{user}.password"
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc.strerror}") from exc
    if text:
        return text
    text = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return text


def etcd_setup(args: argparse.Namespace) -> int:
    directory = Path(args.secrets)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument(f"cannot make the secrets directory {directory}: "
                              f"{exc.strerror}") from exc
    roles = Roles.of(args.cluster)
    passwords = {user: _password(directory, user) for user in (roles.daemon, roles.reader)}
    if args.root_password_file:
        try:
            passwords[ROOT] = Path(args.root_password_file).read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read --root-password-file {args.root_password_file}: "
                                  f"{exc.strerror}") from exc
        if not passwords[ROOT]:
            raise InvalidArgument(f"--root-password-file {args.root_password_file} is empty")
    else:
        passwords[ROOT] = _password(directory, ROOT)
    result = asyncio.run(set_up(args.etcd, args.cluster, passwords))

    def env(user: str) -> dict[str, str]:
        return {"KVSTORE_ETCD_USER": user,
                "KVSTORE_ETCD_PASSWORD_FILE": str(directory.resolve() / f"{user}.password")}

    out: dict[str, Any] = {"etcd": args.etcd, "cluster": args.cluster,
                           "auth_was_on": result.auth_was_on,
                           "daemons": env(roles.daemon), "clients": env(roles.reader)}
    if args.json:
        emit_json(out)
        return 0
    print(f"etcd at {args.etcd}: auth {'was already' if result.auth_was_on else 'is now'} "
          f"on; roles {roles.daemon} (read/write /kvstore/{args.cluster}/) and "
          f"{roles.reader} (read the leader's record only)")
    print("masters and store nodes:  " + " ".join(f"{k}={v}" for k, v in out["daemons"].items()))
    print("clients discovering the leader through etcd (clients given master addresses "
          "need none):  " + " ".join(f"{k}={v}" for k, v in out["clients"].items()))
    if not args.root_password_file:
        print(f"root's password is in {directory / 'root.password'}: keep it for the "
              "operator")
    return 0


def register(sub: Any) -> None:
    """Add `etcd-setup` to the `kvstore` parser's subparsers."""
    help_ = "create etcd's users and roles for a cluster and turn etcd's auth on"
    p: argparse.ArgumentParser = sub.add_parser("etcd-setup", help=help_, description=help_)
    p.add_argument("--etcd", default="127.0.0.1:2379", help="etcd HOST:PORT")
    p.add_argument("--cluster", default="default", help="cluster name (etcd key prefix)")
    p.add_argument("--secrets", required=True, metavar="DIR",
                   help="directory of the users' password files (made if missing, kept if "
                        "there)")
    p.add_argument("--root-password-file", default="", metavar="FILE",
                   help="etcd root's password (a Secret, say) instead of DIR/root.password")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=etcd_setup)
