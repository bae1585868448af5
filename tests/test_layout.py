"""The package layout is the architecture: these tests keep it that way.

Layers, lowest first (docs/architecture.md draws them):

- ``core``: the data model, the OFU math, specs, tiles, blank values, DCGM fields, the metric
  registry. Pure: imports nothing from the rest of otel_ofu.
- ``pipeline``: the component model, config loader, registry, telemetry and service.
- libraries the components share: ``otlp`` (the wire), ``delivery`` (queues, retries), ``scrape``,
  ``gpu`` (DCGM/NVML seams), ``attribution``, ``jobs``, ``sim``.
- components: ``receivers``, ``processors``, ``exporters``; one per module, and a component
  never imports another (the service wires them).
- applications: ``cli`` and ``report``.
- ``training``: the helper training code imports to report its MFU; it may import only the
  core (and, outside otel_ofu, the standard library and the OpenTelemetry SDK).

Every import counts, including those inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "otel_ofu"

CORE = "core"
PIPELINE = "pipeline"
LIBRARIES = {"otlp", "delivery", "gpu", "attribution", "jobs", "sim", "console", "scrape"}
COMPONENTS = {"receivers", "processors", "exporters"}
APPLICATIONS = {"cli", "report"}

# What each layer may import from otel_ofu (its own package is always allowed, except that
# components may not import each other).
ALLOWED: dict[str, set[str]] = {
    CORE: {CORE},
    PIPELINE: {CORE, PIPELINE},
    **{lib: {CORE, PIPELINE, *LIBRARIES} for lib in LIBRARIES},
    **{comp: {CORE, PIPELINE, *LIBRARIES} for comp in COMPONENTS},
    **{app: {CORE, PIPELINE, *LIBRARIES, *COMPONENTS, *APPLICATIONS} for app in APPLICATIONS},
    "training": {CORE, "training"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "proto" not in p.parts}


def imports_of(name: str, path: Path) -> set[str]:
    """Every otel_ofu module ``path`` imports (``from otel_ofu.x import y`` may name a module y)."""
    tree = ast.parse(path.read_text(), str(path))
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("otel_ofu")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("otel_ofu"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {m for m in found if m in known and m != name}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


@functools.cache
def graph() -> dict[str, set[str]]:
    return {name: imports_of(name, path) for name, path in modules().items()}


def test_every_module_belongs_to_a_layer():
    loose = [m for m in modules() if m not in ("otel_ofu", "otel_ofu.__main__") and layer(m) not in ALLOWED]
    assert not loose, f"modules outside the layers (move them into a package, or add the package here): {loose}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(package):
    bad = []
    for module, deps in graph().items():
        if layer(module) != package:
            continue
        for dep in deps:
            dep_layer = layer(dep)
            if dep_layer is None:  # otel_ofu itself: __version__
                continue
            if dep_layer not in ALLOWED[package]:
                bad.append(f"{module} -> {dep}")
            elif package in COMPONENTS and dep_layer in COMPONENTS:
                bad.append(f"{module} -> {dep} (components never import each other)")
    assert not bad, "layering violations:\n" + "\n".join(sorted(bad))


def test_core_is_pure():
    """The core does no I/O: it imports no network, process or file-system modules."""
    impure = {"socket", "subprocess", "threading", "grpc", "http", "urllib", "requests", "sqlite3", "os", "shutil"}
    bad = []
    for name, path in modules().items():
        if layer(name) != CORE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{name} imports {n}" for n in names if n.split(".")[0] in impure]
    assert not bad, bad


def test_training_helper_needs_only_the_standard_library_and_the_opentelemetry_sdk():
    """Training code imports otel_ofu.training: it must not drag in grpc servers, YAML, frameworks."""
    import sys

    allowed = {"opentelemetry", "otel_ofu", "__future__"}
    bad = []
    for name, path in modules().items():
        if layer(name) != "training" and not name.startswith("otel_ofu.core"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{name} imports {n}" for n in names
                    if n.split(".")[0] not in allowed and n.split(".")[0] not in sys.stdlib_module_names]
    assert not bad, bad


def test_no_import_cycles():
    edges = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """The layering test would pass vacuously if lazy imports were missed."""
    assert "otel_ofu.cli.doctor" in graph()["otel_ofu.cli.main"]  # imported inside cmd_run
