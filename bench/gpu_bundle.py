"""What bench.gpu_check needs on a GPU machine that has no package registry, in one folder.

    python -m bench.gpu_bundle                      # writes bench/out/gpu (about 60 MiB)

Run it here (a machine with the registries). It downloads, without installing:
- the CUDA 13 Transfer Engine wheel for Python 3.12 (`mooncake-transfer-engine-cuda13`),
  and the pure-Python or abi3 packages the project imports beyond what the GPU machine
  has (etcd3aio, cryptography with cffi and pycparser), into `wheels/`;
- Debian's etcd-server, libibverbs1, ibverbs-providers and libnuma1, of which it keeps
  the etcd binary (xz-compressed) and the engine's libibverbs, libmlx5 and libnuma, into
  `bin/` and `lib/`. The engine also needs libcurl (on most machines already) and the
  CUDA runtime, which torch's CUDA build brings (bench.gpu_check finds it there).
On the GPU machine, `python -m bench.gpu_check --bundle bench/out/gpu` unpacks it (wheels
into `site/`, etcd decompressed) and runs with it. Nothing is installed system-wide.
"""

from __future__ import annotations

import argparse
import io
import lzma
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

WHEELS = ["mooncake-transfer-engine-cuda13==0.3.14", "etcd3aio==0.3.0", "cryptography",
          "cffi", "pycparser"]
PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
# The engine links libibverbs, libmlx5 (its RDMA provider) and libnuma even for TCP.
DEBS = {"etcd-server": ["usr/bin/etcd"], "libibverbs1": ["libibverbs.so.1"],
        "ibverbs-providers": ["libmlx5.so.1"], "libnuma1": ["libnuma.so.1"]}
DEFAULT_OUT = Path("bench/out/gpu")


@dataclass(frozen=True)
class Paths:
    site: Path
    bin: Path
    lib: Path


def _deb_members(deb: Path) -> tarfile.TarFile:
    """The data archive of a .deb (an `ar` archive: a header, then members)."""
    raw = deb.read_bytes()
    if not raw.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb} is not a Debian package")
    pos = 8
    while pos < len(raw):
        name = raw[pos:pos + 16].decode().strip().rstrip("/")
        size = int(raw[pos + 48:pos + 58].decode().strip())
        body = raw[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(body))
        pos += 60 + size + (size & 1)
    raise ValueError(f"{deb} has no data archive")


def build(out: Path) -> None:
    wheels, bindir, lib = out / "wheels", out / "bin", out / "lib"
    for d in (wheels, bindir, lib):
        d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", PYTHON, "-d", str(wheels)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + WHEELS, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", *DEBS], check=True, cwd=tmp)
        for deb in Path(tmp).glob("*.deb"):
            wanted = next(v for k, v in DEBS.items() if deb.name.startswith(k + "_"))
            with _deb_members(deb) as tar:
                for m in tar.getmembers():
                    base = Path(m.name).name
                    if m.name.endswith("usr/bin/etcd"):
                        src = tar.extractfile(m)
                        assert src is not None
                        (bindir / "etcd.xz").write_bytes(lzma.compress(src.read()))
                    elif m.isfile():
                        # the real file under its soname: a carried tree may drop links
                        so = next((w for w in wanted if base.startswith(w)), None)
                        src = tar.extractfile(m) if so else None
                        if so and src is not None:
                            (lib / so).write_bytes(src.read())
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"{out}: {total / (1 << 20):.1f} MiB; on the GPU machine: "
          f"python -m bench.gpu_check --bundle {out}")


def unpack(bundle: Path) -> Paths:
    """Make `bundle` usable in place (once): wheels unzipped into site/, etcd decompressed."""
    paths = Paths(bundle / "site", bundle / "bin", bundle / "lib")
    if not (bundle / "wheels").is_dir():
        raise SystemExit(f"{bundle} holds no wheels/: write it with `python -m bench.gpu_bundle`")
    done = paths.site / ".unpacked"
    if not done.exists():
        paths.site.mkdir(parents=True, exist_ok=True)
        for whl in sorted((bundle / "wheels").glob("*.whl")):
            with zipfile.ZipFile(whl) as z:
                z.extractall(paths.site)
        etcd = paths.bin / "etcd"
        if (paths.bin / "etcd.xz").exists():
            etcd.write_bytes(lzma.decompress((paths.bin / "etcd.xz").read_bytes()))
            etcd.chmod(0o755)
        done.touch()
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_bundle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
