"""The repository stands on its own: every relative link in its markdown resolves inside
it (the file, and the heading an #anchor names), and no file names a path of the machine
it was written on or material outside the repository."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted({ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/*.md"),
               *ROOT.glob("*_adapter/README.md"), *ROOT.glob("deploy/**/README.md"),
               *ROOT.glob("bench/**/*.md")})
# What is not the project's: the environment, build outputs and caches (.gitignore).
SKIP_DIRS = {".git", ".venv", ".kvstore", "__pycache__", ".pytest_cache", ".mypy_cache",
             ".ruff_cache", "build", "out"}
# A path outside the repository or of one machine: the lab's work tree, the material
# beside the repository, a user's home directory under a real name.
FOREIGN = re.compile(r"/work/|\.\./shared\b|shared/traces|\b(?:DESIGN|STYLE|LAB_NOTES)\.md\b")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def strip_code(text: str) -> str:
    """The text without fenced blocks and inline code: a link there is an example."""
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, blanks to '-'."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M).splitlines():
        m = re.match(r"#{1,6} +(.*?) *#*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken(path: Path, text: str) -> list[str]:
    """The links of `text` (the markdown file `path`) that do not resolve, and why."""
    bad = []
    for m in LINK.finditer(strip_code(text)):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve()
        if not file:
            if anchor not in anchors(text):
                bad.append(f"{target}: no such heading here")
        elif not dest.is_relative_to(ROOT):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return bad


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    bad = broken(path, path.read_text())
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_checked_documents_are_there() -> None:
    names = {str(p.relative_to(ROOT)) for p in DOCS}
    assert {"README.md", "CONTRIBUTING.md", "docs/architecture.md", "vllm_adapter/README.md",
            "sglang_adapter/README.md", "lmcache_adapter/README.md"} <= names


def test_the_link_check_catches_what_it_should() -> None:
    assert slug("What `make lint` checks") == "what-make-lint-checks"
    assert slug("Leases and pins: the promise") == "leases-and-pins-the-promise"
    assert anchors("# A\n## B\n```\n# not a heading\n```\n## B\n") == {"a", "b", "b-1"}
    text = ("# Top\n\n[ok](#top) [ok](architecture.md) [gone](nothere.md) [here](#nowhere) "
            "[anchor](architecture.md#no-such-heading) [out](../../x.md)\n"
            "`[code](ignored.md)` [web](https://example.org/x) ![img](../bench/vs_mooncake.png)\n")
    assert broken(ROOT / "docs" / "probe.md", text) == [
        "nothere.md: no such file", "#nowhere: no such heading here",
        "architecture.md#no-such-heading: no heading #no-such-heading in docs/architecture.md",
        "../../x.md: outside the repository"]


def text_files() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode()
        except UnicodeDecodeError:
            continue
        yield path


def test_no_file_names_a_path_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    found = []
    for path in text_files():
        if path == me:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if FOREIGN.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


TOP = "tests|bench|kvstore|client|docs|deploy|proto|vllm_adapter|sglang_adapter|lmcache_adapter"
PATH_NAMED = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./-]*\w)")
OUTPUTS = ("bench/out/",)  # the benchmarks' output folder (.gitignore)
MODULE_RUN = re.compile(r"python -m ((?:bench|tests|kvstore)\.[\w.]+)")


def missing_names(path: Path, text: str) -> list[str]:
    """Repository paths and `python -m` modules that `text` names but that do not exist
    (an upper-case part, like bench.NAME, is a placeholder)."""
    bad = []
    for m in PATH_NAMED.finditer(text):
        name = m.group(1)
        if name.startswith(OUTPUTS):
            continue  # written by the command the text shows, never committed
        if not (ROOT / name).exists() and not (path.parent / name).exists():
            bad.append(name)
    for m in MODULE_RUN.finditer(text):
        parts = m.group(1).split(".")
        if any(p.isupper() for p in parts):
            continue
        base = ROOT.joinpath(*parts)
        if not base.with_suffix(".py").exists() and not (base / "__init__.py").exists():
            bad.append(f"python -m {m.group(1)}")
    return bad


# deploy/'s READMEs are left out: there `deploy/kvstore-master` is kubectl's name of a
# Kubernetes Deployment, not a path.
@pytest.mark.parametrize("path", [p for p in DOCS if not p.is_relative_to(ROOT / "deploy")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_command_module_named_exists(path: Path) -> None:
    bad = missing_names(path, path.read_text())
    assert not bad, f"{path.relative_to(ROOT)} names what is not in the repository: {bad}"


def test_the_name_check_catches_what_it_should() -> None:
    text = ("run `python -m bench.replay` or `python -m bench.nothere`, `kvstore bench NAME`, "
            "`python -m bench.NAME`; see tests/unit/polling.py and tests/unit/gone.py")
    assert missing_names(ROOT / "README.md", text) == ["tests/unit/gone.py", "python -m bench.nothere"]
