"""The README and docs/ as a user reads them: links resolve, benchmark pages name commands that exist, and
no lab-notebook history (rounds, commit hashes, scratch paths) is left in the README or the benchmark pages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
BENCHMARKS = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))
BENCHMARK_PAGES = [page for page in BENCHMARKS if page.name != "README.md"]  # README.md is the index
MAX_README_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
_HISTORY = re.compile(r"\b(this|last|next|previous) (round|session)\b|\bearlier rounds?\b", re.I)
# a short or full commit hash: 7-40 hex digits with at least one letter and one digit
_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
_SCRATCH = re.compile(r"(?<![\w.])/tmp/|/work/")
_SCRIPT_COMMAND = re.compile(r"python\S* (scripts/\w+\.py)([^\n`]*)")


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code, where link syntax is literal text."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8")))}


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", [README, *BENCHMARKS], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lab_notebook_history(page):
    text = page.read_text(encoding="utf-8")
    found = [m.group(0) for pattern in (_HISTORY, _COMMIT, _SCRATCH) for m in pattern.finditer(text)]
    assert not found, f"{page.relative_to(ROOT)} holds history that belongs in git: {found}"


def test_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; measurements belong in docs/benchmarks/"


def test_quick_start_commands_exist():
    """The README's two commands are Makefile targets, and CI runs the test one."""
    readme = README.read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("run", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target!r} target"
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", BENCHMARK_PAGES, ids=lambda p: p.name)
def test_benchmark_page_names_a_command_that_exists(page):
    """Every benchmark page says how to regenerate it, with a script and flags that exist."""
    commands = _SCRIPT_COMMAND.findall(page.read_text(encoding="utf-8"))
    assert commands, f"{page.name} gives no `python scripts/...` command that regenerates it"
    for script, arguments in commands:
        path = ROOT / script
        assert path.is_file(), f"{page.name}: {script} does not exist"
        source = path.read_text(encoding="utf-8")
        for flag in re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", arguments):
            assert f'"{flag}"' in source or f"'{flag}'" in source, f"{page.name}: {script} has no {flag}"


@pytest.mark.slow
def test_readme_python_example_runs():
    """The README's Python example runs as written, from the repository root."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) == 1, "the README should hold one Python example"
    done = subprocess.run([sys.executable, "-c", blocks[0]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "over DP-NCCL" in done.stdout and "proven optimal" in done.stdout
