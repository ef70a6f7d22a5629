"""tag's packages are layered: a module imports only from its own layer and the layers below it
(docs/architecture.md, Packages). Checked twice: every import statement of every module, read with ``ast``
(inside functions too, so a late import does not hide an upward one), and what importing each package
loads in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tag"

# Bottom to top. A module belongs to the layer of the longest name here that it starts with; a package's
# ``cli`` module (one command's parse → call → render) belongs to the command line's layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    # foundation: errors, units, array and file helpers, and the profile file's data model that the
    # cluster and cost model read (the rest of tag.profile measures, near the top)
    ("tag.errors", "tag.units", "tag._arrays", "tag._atomic", "tag._compiled", "tag._read", "tag._rng",
     "tag._schema", "tag.profile.data"),
    ("tag.models", "tag.cluster"),
    ("tag.graph",),
    ("tag.cost",),
    ("tag.grouping", "tag.strategy", "tag.sim"),
    ("tag.compiler",),
    ("tag.sfb", "tag.baselines", "tag.exact"),
    ("tag.search", "tag.graphpipe"),
    ("tag.policy",),
    ("tag.planner", "tag.training"),  # TAG's placement planner; self-play and mapper training
    ("tag.planners",),
    ("tag.compare",),
    ("tag.execute",),
    ("tag.profile",),
    ("tag.cli", "tag.__main__"),
)
CLI_LAYER = len(LAYERS) - 1
# Package roots whose own __init__ sits below their package: tag.profile's re-exports the data model alone,
# so that the cluster and cost model can read a profile without loading the profiler.
PACKAGE_ROOTS = {"tag.profile": 0}
# What ``import tag`` may load: the public surface re-exports the foundation up to the simulator and the
# strategy data model eagerly, and the planners lazily (tag/__init__.py).
ROOT_SURFACE_LAYER = 4

# Upward imports that remain, each in code that another change owns. Key: (importing module, imported
# module); value: why it is here. A fixed one must leave this list (the test says so).
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int | None:
    """The layer index of a ``tag`` module, None for a module outside tag."""
    if module == "tag" or not module.startswith("tag."):
        return None  # tag itself, the public surface, is checked by what it loads (see _PROBE)
    if module in PACKAGE_ROOTS:
        return PACKAGE_ROOTS[module]
    if module.endswith(".cli") or ".cli." in module:
        return CLI_LAYER
    best, index = "", None
    for k, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, index = name, k
    return index


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of this checkout."""
    path = ROOT / Path(*name.split("."))
    return (path / "__init__.py").exists() or path.with_suffix(".py").exists()


def imported_modules(source: str, name: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in the ``source`` of module ``name``, at any depth; ``from a import
    b`` names ``a.b`` when that is a module, else ``a``; relative imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else base))
    return found


def upward_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importer, imported) of every import of a module above the importer's layer."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        low = layer_of(importer)
        if low is None:
            continue
        for line, imported in imported_modules(path.read_text(), importer, is_package=path.name == "__init__.py"):
            high = layer_of(imported)
            if high is not None and high > low:
                out.append((str(path.relative_to(ROOT)), line, importer, imported))
    return out


def test_every_module_has_a_layer():
    missing = [module_name(p) for p in sorted(PACKAGE.rglob("*.py"))
               if module_name(p) != "tag" and layer_of(module_name(p)) is None]
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def test_no_module_imports_from_a_layer_above_its_own():
    found = upward_imports()
    unknown = sorted({f"{path}:{line}: {importer} (layer {layer_of(importer)}) imports {imported} "
                      f"(layer {layer_of(imported)})" for path, line, importer, imported in found
                      if (importer, imported) not in KNOWN_EXCEPTIONS})
    assert not unknown, "upward imports:\n" + "\n".join(unknown)
    stale = set(KNOWN_EXCEPTIONS) - {(importer, imported) for _, _, importer, imported in found}
    assert not stale, f"known exceptions that no longer occur (remove them): {sorted(stale)}"


# Run in a fresh interpreter: import the package root, then every module of tag bottom to top (all but the
# command line's), and record the tag modules each import loads. Modules come in layer order, so what
# appears while importing one was loaded by it (what it needs from below was loaded before). What ``import
# tag`` itself loads (the public surface) is checked as a whole; the ast test covers those modules one by one.
_PROBE = """
import importlib, json, sys
order = json.loads(sys.argv[1])
def loaded():
    return {m for m in sys.modules if m == "tag" or m.startswith("tag.")}
seen = loaded()
import tag
report = {"tag": sorted(loaded() - seen)}
seen = loaded()
for module in order:
    importlib.import_module(module)
    report[module] = sorted(loaded() - seen)
    seen = loaded()
print(json.dumps(report))
"""


def test_importing_each_module_loads_nothing_from_a_layer_above():
    modules = [module_name(path) for path in PACKAGE.rglob("*.py")]
    order = sorted((m for m in modules if m != "tag" and layer_of(m) < CLI_LAYER), key=lambda m: (layer_of(m), m))
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(order)], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    problems = [f"import tag loads {m} (layer {layer_of(m)})" for m in report.pop("tag")
                if (layer_of(m) or 0) > ROOT_SURFACE_LAYER]
    for module, new in report.items():
        problems += [f"import {module} (layer {layer_of(module)}) loads {m} (layer {layer_of(m)})"
                     for m in new if (layer_of(m) or 0) > layer_of(module)
                     and (module, m) not in KNOWN_EXCEPTIONS]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module,layer", [("tag.profile.data", 0), ("tag.profile", 0), ("tag.profile.report", 13),
                                          ("tag.exact.mapping", 6), ("tag.planners.cli", CLI_LAYER),
                                          ("tag.cli.pipeline", CLI_LAYER), ("tag.planners.mappers", 10), ("numpy", None),
                                          ("tag", None)])
def test_layer_of_takes_the_longest_name_and_puts_commands_on_top(module, layer):
    assert layer_of(module) == layer


def test_imports_are_found_inside_functions_and_relative_ones_resolved():
    """A late import still counts, ``from package import module`` names the module, and a relative
    import is resolved against the importing module's package."""
    source = (
        "import numpy as np\n"
        "from tag.exact.mapping import MappingProblem\n"
        "def late():\n"
        "    from tag.search import MappingEnv\n"
        "    from tag.policy import mapping\n"
        "    from . import heuristics\n"
        "    from ..planners.mappers import make_mapper\n"
    )
    found = imported_modules(source, "tag.exact.example")
    assert found == [(1, "numpy"), (2, "tag.exact.mapping"), (4, "tag.search"), (5, "tag.policy.mapping"),
                     (6, "tag.exact.heuristics"), (7, "tag.planners.mappers")]
    upward = [module for _, module in found if (layer_of(module) or 0) > layer_of("tag.exact.example")]
    assert upward == ["tag.search", "tag.policy.mapping", "tag.planners.mappers"]
