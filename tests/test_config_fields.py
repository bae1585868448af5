"""Every config field is read by the code it configures (issue 22: `DeliveryOptions.queue_enabled`
was set from `sending_queue.enabled` and read by nothing).

A key a user sets and nothing reads is worse than an unknown key: it is accepted, documented,
and does nothing. For every field of every component config dataclass (the factories' configs
and every dataclass they contain), and of the option dataclasses the components build from them,
this test looks (in the AST of otel_ofu) for a read of it: ``x.field`` or ``getattr(x, "field")``,
outside any ``validate()`` and outside the generated reference (cli/docs.py), in a
module that can know the class: where it, or a config containing it, is defined or imported, a
module those import (the helpers a config is passed to), or the runtime (pipeline/).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import typing
from pathlib import Path

from otel_ofu.delivery import DeliveryOptions
from otel_ofu.otlp.exporter_config import Settings
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import ServiceConfig
from otel_ofu.report.build import ReadOptions

PACKAGE = Path(__file__).resolve().parent.parent / "otel_ofu"
# Built by the components or the service from configs, and read by the code they configure.
OPTION_CLASSES = (DeliveryOptions, Settings, ServiceConfig, ReadOptions)
NOT_READERS = ("cli/docs.py",)  # lists every field of every config: it documents, it does not use


@dataclasses.dataclass(frozen=True)
class Read:
    module: str
    line: int
    cls: str | None
    function: str | None


def _contained(cls: type) -> list[type]:
    """The dataclasses a config's fields hold (nested configs, list items, Annotated extras)."""
    out = []
    for hint in typing.get_type_hints(cls, include_extras=True).values():
        stack = [hint]
        while stack:
            tp = stack.pop()
            if dataclasses.is_dataclass(tp):
                out.append(tp)
            stack += [a for a in (*typing.get_args(tp), *getattr(tp, "__metadata__", ())) if a is not tp]
    return out


@functools.cache
def config_classes() -> dict[type, set[type]]:
    """Every config dataclass, with the configs that contain it (their modules know it too)."""
    containers: dict[type, set[type]] = {}
    todo = [f.config_type for section in registry.factories().values() for f in section.values()]
    todo += OPTION_CLASSES
    while todo:
        cls = todo.pop()
        containers.setdefault(cls, set())
        for inner in _contained(cls):
            if inner not in containers:
                todo.append(inner)
            containers.setdefault(inner, set()).add(cls)
    return containers


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


@functools.cache
def sources() -> dict[str, ast.Module]:
    return {_module_of(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))
            if "proto" not in p.parts}


@functools.cache
def imports() -> dict[str, frozenset[str]]:
    """Module -> the otel_ofu modules and names it imports."""
    out = {}
    for module, tree in sources().items():
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("otel_ofu"):
                names.add(node.module or "")
                names |= {alias.name for alias in node.names}
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names if alias.name.startswith("otel_ofu")}
        out[module] = frozenset(names)
    return out


@functools.cache
def reads() -> dict[str, list[Read]]:
    """Attribute name -> every place it is read."""
    found: dict[str, list[Read]] = {}

    def walk(node: ast.AST, module: str, cls: str | None, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner_cls, inner_fn = cls, function
            if isinstance(child, ast.ClassDef):
                inner_cls, inner_fn = child.name, None
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner_fn = child.name
            if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
                found.setdefault(child.attr, []).append(Read(module, child.lineno, cls, function))
            elif (isinstance(child, ast.Call) and getattr(child.func, "id", None) == "getattr"
                  and len(child.args) >= 2 and isinstance(child.args[1], ast.Constant)):
                found.setdefault(str(child.args[1].value), []).append(Read(module, child.lineno, cls, function))
            walk(child, module, inner_cls, inner_fn)

    for module, tree in sources().items():
        if not any(module.endswith(n.replace("/", ".").removesuffix(".py")) for n in NOT_READERS):
            walk(tree, module, None, None)
    return found


def knowing_modules(cls: type) -> set[str]:
    """Modules that can read ``cls``'s fields: see the module docstring."""
    family = {cls}
    todo = [cls]
    while todo:  # the configs that contain it, transitively
        for outer in config_classes().get(todo.pop(), ()):
            if outer not in family:
                family.add(outer)
                todo.append(outer)
    defining = {c.__module__ for c in family}
    users = {m for m, names in imports().items()
             if any(c.__name__ in names or c.__module__ in names for c in family)}
    helpers = {name for m in defining | users for name in imports().get(m, ()) if name in sources()}
    runtime = {m for m in sources() if m.startswith("otel_ofu.pipeline.")}
    return defining | users | helpers | runtime


def declared_fields(cls: type) -> list[str]:
    """The fields ``cls`` declares itself (an inherited one is checked on the class declaring it)."""
    own = cls.__dict__.get("__annotations__", {})
    return [f.name for f in dataclasses.fields(cls) if f.name in own]


def _validation(read: Read) -> bool:
    """A read by a config check (``validate()``, ``validate_settings()``): checking a key is not using it."""
    return (read.function or "").startswith("validate")


def unread_fields() -> list[str]:
    out = []
    for cls in config_classes():
        known = knowing_modules(cls)
        for name in declared_fields(cls):
            used = [r for r in reads().get(name, []) if r.module in known and not _validation(r)]
            if not used:
                out.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return sorted(out)


def test_the_check_sees_every_component_config():
    classes = {c.__name__ for c in config_classes()}
    assert {"FileExporterConfig", "RotationConfig", "QueueConfig", "RetryConfig", "JobsConfig", "AuditConfig",
            "KubernetesApiSourceConfig", "RuleMatchConfig", "SimPhaseConfig", "DeliveryOptions"} <= classes


def test_the_check_finds_a_field_nothing_reads():
    @dataclasses.dataclass
    class Probe:
        surely_never_read_anywhere: bool = True

    config_classes()[Probe] = {DeliveryOptions}
    try:
        assert "surely_never_read_anywhere" in " ".join(unread_fields())
    finally:
        del config_classes()[Probe]


def test_every_config_field_is_read_by_the_code_it_configures():
    unread = unread_fields()
    assert not unread, ("fields nothing reads (a key that does nothing): wire each to what it should "
                        f"configure, or remove it: {unread}")
