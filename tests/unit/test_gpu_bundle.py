"""bench/gpu_bundle.py: a Debian package's data archive is read without dpkg, and a
bundle unpacks in place (wheels into site/, etcd decompressed) once."""

from __future__ import annotations

import io
import lzma
import tarfile
import zipfile
from pathlib import Path

from bench.gpu_bundle import _deb_members, unpack


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, body in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
        out += body + (b"\n" if len(body) & 1 else b"")
    return out


def test_the_data_archive_of_a_deb_is_found(tmp_path: Path) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        info = tarfile.TarInfo("./usr/bin/etcd")
        body = b"\x7fELF fake"
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    deb = tmp_path / "etcd-server_1_amd64.deb"
    deb.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": b"x",
                         "data.tar.xz": data.getvalue()}))
    with _deb_members(deb) as tar:
        assert [m.name for m in tar.getmembers()] == ["./usr/bin/etcd"]


def test_a_bundle_unpacks_once_in_place(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / "pkg-1-py3-none-any.whl", "w") as z:
        z.writestr("pkg/__init__.py", "VALUE = 1\n")
    (tmp_path / "bin" / "etcd.xz").write_bytes(lzma.compress(b"#!/bin/sh\necho etcd\n"))
    paths = unpack(tmp_path)
    assert (paths.site / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    etcd = paths.bin / "etcd"
    assert etcd.read_bytes().startswith(b"#!/bin/sh") and etcd.stat().st_mode & 0o111
    (paths.site / "pkg" / "__init__.py").write_text("VALUE = 2\n")
    unpack(tmp_path)  # done once: what is there is kept
    assert (paths.site / "pkg" / "__init__.py").read_text() == "VALUE = 2\n"
