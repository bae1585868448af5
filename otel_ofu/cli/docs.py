"""The reference, generated from the code: ``python -m otel_ofu.cli.docs`` (``--check`` in tests).

After the Collector's ``mdatagen``: the code is the one source of truth, the docs are its
rendering. Each component has a page ``docs/components/<kind>/<type>.md``; between markers
(``<!-- generated:NAME -->`` ... ``<!-- /generated:NAME -->``) this module writes

- ``about``: the component's module docstring (what it reads or does, its failure states);
- ``config``: every config key with its type, default and meaning, from the config
  dataclass (meanings are the comments beside each field, so they live with the code);
- ``sample``: the component's block from a shipped config in ``collector-config/``;
- ``metrics``: what the component emits, from the metric registry.

Text outside the markers is written by hand and kept. ``docs/metrics.md`` holds the whole
metric registry. ``--check`` lists every page that is out of date and exits 1.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from otel_ofu.core import attributes, metrics
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.component import Factory
from otel_ofu.pipeline.config import Duration, FieldError, build_config, type_name

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
COMPONENT_DOCS = DOCS / "components"
SHIPPED_CONFIGS = ROOT / "collector-config"
KINDS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter"}


# --- config keys ----------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted path; "[]" marks a list item
    type: str
    default: str
    description: str


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its meaning, from the comments in the class body.

    A field's meaning is the comment block right above it plus its trailing comment. A comment
    block that ends with ":" and is followed directly by fields is a group heading: it starts
    the meaning of each field of the group (up to the next blank line or comment block), so
    ``# Reconnect backoff:`` can stand above ``initial_interval`` and ``max_interval``.
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    (node,) = ast.parse(source).body
    group = ""
    previous_end = 0
    for stmt in node.body:  # type: ignore[attr-defined]
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            group, previous_end = "", stmt.end_lineno or stmt.lineno
            continue
        trailing = [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in comments]
        above: list[str] = []
        n = stmt.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#"):
            above.insert(0, comments.get(n, ""))
            n -= 1
        between = lines[previous_end:stmt.lineno - 1]
        if above or any(not line.strip() for line in between):
            group = ""  # a comment block or a blank line ends a group
        if above and above[-1].endswith(":"):
            group, above = " ".join(above), []
        text = " ".join(part for part in (group, *above, *trailing) if part).strip()
        if text:
            out[stmt.target.id] = text
        previous_end = stmt.end_lineno or stmt.lineno
    return out


def _comments(cls: type) -> dict[str, str]:
    """Comments of a dataclass's fields, including inherited ones (the subclass's win)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            out.update(field_comments(base))
    return out


def _class_summary(cls: type) -> str:
    """The first paragraph of a config class's own docstring (not a dataclass's generated one)."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def format_default(value: Any, key: str = "") -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, Duration):
        return format_duration(float(value))
    if value is None:
        return "unset"
    if isinstance(value, str):
        return '""' if value == "" else value
    if isinstance(value, bool):
        return "true" if value else "false"
    if type(value).__name__ == "_Unset":
        return "unset"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0 and key.endswith(("size", "bytes")):
        return f"{value} ({value >> 20} MiB)"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) >= 1 else str(value)
    if isinstance(value, (list, tuple, dict)):
        return yaml.safe_dump(_plain(value), default_flow_style=True, width=10_000).strip() or "[]"
    return str(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Duration):
        return format_duration(float(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def format_duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size and abs(seconds / size - round(seconds / size)) < 1e-9:
            return f"{round(seconds / size)}{unit}"
    return f"{seconds:g}s"


_TYPE_WORDS = {str: ("string", "strings"), int: ("integer", "integers"), float: ("number", "numbers"),
               bool: ("bool", "bools"), Duration: ("duration", "durations")}


def doc_type(tp: Any, plural: bool = False) -> str:
    """A config key's type in words, for the reference: ``list of durations``, ``auto, dmon or csv``."""
    if tp in _TYPE_WORDS:
        return _TYPE_WORDS[tp][plural]
    if dataclasses.is_dataclass(tp):
        return "mappings" if plural else "mapping"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        words = [f"`{a}`" if a != "" else '`""`' for a in args]
        return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
    if origin in (list, tuple):
        return f"list of {doc_type(args[0], plural=True)}" if args else "list"
    if origin is dict:
        return f"mapping of {doc_type(args[0])} to {doc_type(args[1])}" if args else "mapping"
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        return " or ".join(doc_type(a, plural) for a in arms)
    if tp is Any:
        return "any"
    return type_name(tp)


def _nested(tp: Any) -> tuple[type | None, str]:
    """The dataclass inside a field's type, and the key suffix that reaches it ("" or "[]")."""
    if dataclasses.is_dataclass(tp):
        return tp, ""  # type: ignore[return-value]
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (list, tuple) and args and dataclasses.is_dataclass(args[0]):
        return args[0], "[]"
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _nested(args[0])
    return None, ""


def default_config(cls: type) -> tuple[Any, set[str]]:
    """``build_config(cls, {})``: what ``otel-ofu validate`` makes of an empty block, and the
    keys it says must be set (then the dataclass's own defaults stand in for the rest)."""
    try:
        return build_config(cls, {}), set()
    except FieldError as exc:
        return cls(), {error.key for error in exc.all}


def config_keys(cls: type, instance: Any = None, prefix: str = "", required: set[str] | None = None) -> list[KeyDoc]:
    """Every key of a config dataclass, nested configs flattened to dotted keys.

    Defaults are read from ``instance`` (``default_config(cls)`` at the top), so what the
    reference shows is what the config loader produces; keys under a list (``rules[].job_id``)
    show the item class's own defaults.
    """
    if instance is None and not prefix:
        instance, required = default_config(cls)
    required = required or set()
    hints = typing.get_type_hints(cls)
    declared = typing.get_type_hints(cls, include_extras=True)
    comments = _comments(cls)
    out: list[KeyDoc] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if instance is not None:
            default: Any = getattr(instance, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        key = f"{prefix}{f.name}"
        if key in required:
            default = dataclasses.MISSING
        inner, suffix = _nested(tp)
        if inner is None and tp is Any:
            # A key typed loosely so validate() can tell "absent" from "empty" (the otlp receiver's
            # protocols): its schema is its default's class, or named with Annotated[Any, Schema].
            schema = [a for a in typing.get_args(declared[f.name])[1:] if dataclasses.is_dataclass(a)]
            if dataclasses.is_dataclass(default):
                inner = type(default)
            elif schema:
                inner = schema[0]
        meaning = comments.get(f.name, "")
        if inner is None:
            out.append(KeyDoc(key, doc_type(tp), format_default(default, key), meaning))
        elif suffix:
            out.append(KeyDoc(key, "list of mappings", format_default(default, key), meaning or _class_summary(inner)))
            out += config_keys(inner, None, f"{key}[].", required)
        else:
            shown = "" if dataclasses.is_dataclass(default) else format_default(default, key)  # absent: "unset"
            out.append(KeyDoc(key, "mapping", shown, meaning or _class_summary(inner)))
            out += config_keys(inner, default if dataclasses.is_dataclass(default) else None, f"{key}.", required)
    return out


def _sentence(text: str) -> str:
    """A comment as a table cell: Markdown code spans, pipes escaped."""
    return markdown_from_docstring(text).replace("|", "\\|")


def config_table(cls: type) -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in config_keys(cls):
        meaning = _sentence(k.description) or "—"
        default = f"`{k.default}`" if k.default else ""
        rows.append(f"| `{k.key}` | {k.type.replace('|', chr(92) + '|')} | {default} | {meaning} |")
    return "\n".join(rows)


# --- metrics --------------------------------------------------------------------------------

def module_metric_names(module_name: str) -> list[str]:
    """Names of the metrics a module defines (``MetricInfo("name", ...)`` calls in its source)."""
    source = Path(importlib.import_module(module_name).__file__ or "").read_text()
    names = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "MetricInfo" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.append(node.args[0].value)
    return names


def ordered_metrics() -> list[metrics.MetricInfo]:
    """The registry in a fixed order: the core's metrics as declared, then the rest by name.

    ``METRICS`` itself is in import order, which differs between a test run and the command.
    """
    registry.factories()
    core = [m.name for m in metrics._METRICS]
    return [metrics.METRICS[n] for n in core] + sorted(
        (m for m in metrics.METRICS.values() if m.name not in core), key=lambda m: m.name)


def component_metrics(module_name: str, section: str, component_type: str) -> list[metrics.MetricInfo]:
    names = module_metric_names(module_name)
    qualified = f"{section}/{component_type}"
    names += [m.name for m in ordered_metrics() if qualified in m.emitted_by and m.name not in names]
    return [metrics.METRICS[n] for n in names if n in metrics.METRICS]


def metric_table(infos: list[metrics.MetricInfo]) -> str:
    if not infos:
        return "This component emits no metrics of its own."
    rows = ["| metric | unit | kind | point attributes | meaning |", "|---|---|---|---|---|"]
    for m in infos:
        names = ", ".join(f"`{a}`" for a in attributes.point_attributes(m.name)) or "—"
        rows.append(f"| `{m.name}` | `{m.unit}` | {m.kind} | {names} | {m.description} |")
    return "\n".join(rows)


def metric_reference() -> str:
    """The whole registry (``docs/metrics.md``)."""
    return metric_table(ordered_metrics())


def attribute_table(infos: list[attributes.AttributeInfo], with_metrics: bool = False) -> str:
    head = ["attribute", "meaning", "set by"] + (["on metrics"] if with_metrics else [])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in infos:
        by = ", ".join(f"[`{c.split('/')[1]}`](components/{c}.md)" for c in a.set_by) or "—"
        cells = [f"`{a.name}`", a.description, by]
        if with_metrics:
            cells.append(", ".join(f"`{m}`" for m in a.metrics))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def attribute_reference() -> dict[str, str]:
    """The attribute registry as two tables (``docs/metrics.md``): resource and point attributes."""
    every = list(attributes.ATTRIBUTES.values())
    return {"resource-attributes": attribute_table([a for a in every if a.on == attributes.RESOURCE]),
            "point-attributes": attribute_table([a for a in every if a.on == attributes.POINT], with_metrics=True)}


def component_attributes(section: str, component_type: str) -> str:
    """The attributes a component sets, one line each, linked to the reference."""
    qualified = f"{section}/{component_type}"
    names = [a.name for a in attributes.ATTRIBUTES.values() if qualified in a.set_by]
    if not names:
        return ""
    return ("Attributes it sets ([meanings](../../metrics.md#attributes)): "
            + ", ".join(f"`{n}`" for n in names) + ".")


# --- samples --------------------------------------------------------------------------------

def _block_text(text: str, section: str, comp_id: str) -> str | None:
    """A component's block as written in a config file, comments kept (None if not found plainly)."""
    lines = text.splitlines()
    try:
        start = lines.index(f"{section}:")
    except ValueError:
        return None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line and not line.startswith((" ", "#")):
            return None  # the next section: not found
        if re.match(rf"  {re.escape(comp_id)}:(\s|$)", line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end].startswith("   ")):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            return "\n".join([f"{section}:", *lines[i:end]])
    return None


def sample_config(section: str, component_type: str) -> str:
    """The component's longest block in the shipped otel-ofu configs (the most keys shown), as written."""
    found: list[tuple[int, str, str]] = []
    for path in sorted(SHIPPED_CONFIGS.glob("*.yaml")):
        if path.name.startswith("otelcol-"):
            continue  # Collector configs, not otel-ofu's
        text = path.read_text()
        doc = yaml.safe_load(text) or {}
        for comp_id, body in (doc.get(section) or {}).items():
            if str(comp_id).split("/", 1)[0] == component_type:
                block = _block_text(text, section, str(comp_id)) or yaml.safe_dump(
                    {section: {comp_id: body}}, sort_keys=False, width=100).rstrip()
                found.append((-block.count("\n"), path.name, block))
    if found:
        _, name, block = min(found)
        return f"From [`collector-config/{name}`](../../../collector-config/{name}):\n\n```yaml\n{block}\n```"
    return "No shipped config in `collector-config/` uses this component; the examples above show it in use."


# --- pages ----------------------------------------------------------------------------------

_BLOCK = re.compile(r"<!-- generated:([\w-]+) -->\n.*?<!-- /generated:\1 -->", re.S)


def _block(name: str, body: str) -> str:
    return f"<!-- generated:{name} -->\n{body.rstrip()}\n<!-- /generated:{name} -->"


_DOCS_PATH = re.compile(r"(?<![\w/\[`])(?<!\]\()docs/([\w/-]+\.md)(#[\w-]+)?")


def link_docs(text: str, to_docs: str) -> str:
    """``docs/x.md`` named in code comments and docstrings, as links from a page ``to_docs`` away."""
    return _DOCS_PATH.sub(lambda m: f"[{m.group(1)}]({to_docs}{m.group(1)}{m.group(2) or ''})", text)


def component_blocks(section: str, factory: Factory) -> dict[str, str]:
    module_name = _component_module(section, factory.type)
    about = markdown_from_docstring(inspect.getdoc(importlib.import_module(module_name)) or factory.description)
    metric_part = "\n\n".join(part for part in (
        metric_table(component_metrics(module_name, section, factory.type)),
        component_attributes(section, factory.type)) if part)
    return {
        "about": link_docs(about, "../../"),
        "config": link_docs(config_table(factory.config_type), "../../"),
        "sample": sample_config(section, factory.type),
        "metrics": link_docs(metric_part, "../../"),
    }


def markdown_from_docstring(text: str) -> str:
    """reStructuredText-ish docstrings as Markdown: ``x`` and :role:`x` become `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _component_module(section: str, component_type: str) -> str:
    for module_name in registry.COMPONENT_MODULES[section]:
        if importlib.import_module(module_name).FACTORY.type == component_type:
            return module_name
    raise KeyError(f"{section}.{component_type}")


def page_path(section: str, component_type: str) -> Path:
    return COMPONENT_DOCS / section / f"{component_type}.md"


def new_page(section: str, factory: Factory) -> str:
    return (f"# `{factory.type}` {KINDS[section]}\n\n{factory.description[:1].upper()}{factory.description[1:]}.\n\n"
            + _block("about", "") + "\n\n## Configuration\n\n" + _block("config", "")
            + "\n\n## Sample\n\n" + _block("sample", "") + "\n\n## Metrics\n\n" + _block("metrics", "") + "\n")


def render_page(text: str, blocks: dict[str, str]) -> str:
    return _BLOCK.sub(lambda m: _block(m.group(1), blocks[m.group(1)]) if m.group(1) in blocks else m.group(0), text)


def expected_pages() -> dict[Path, str]:
    """Every generated file and the content it should have."""
    out: dict[Path, str] = {}
    index = ["# Components", "", "Every receiver, processor and exporter, one page each (generated by "
             "`python -m otel_ofu.cli.docs` from the code).", ""]
    for section, table in registry.factories().items():
        index += [f"## {section.capitalize()}", "", "| type | what it does |", "|---|---|"]
        for ctype in sorted(table):
            factory = table[ctype]
            path = page_path(section, ctype)
            current = path.read_text() if path.exists() else new_page(section, factory)
            out[path] = render_page(current, component_blocks(section, factory))
            index.append(f"| [`{ctype}`]({section}/{ctype}.md) | {factory.description} |")
        index.append("")
    out[COMPONENT_DOCS / "README.md"] = "\n".join(index)
    metrics_page = DOCS / "metrics.md"
    current = metrics_page.read_text() if metrics_page.exists() else (
        "# Metrics and attributes\n\n" + _block("metrics", "") + "\n\n## Attributes\n\n"
        + _block("resource-attributes", "") + "\n\n" + _block("point-attributes", "") + "\n")
    blocks = {"metrics": metric_reference(), **attribute_reference()}
    out[metrics_page] = render_page(current, {name: link_docs(text, "") for name, text in blocks.items()})
    from otel_ofu.report.backend import queries_table
    from otel_ofu.report.build import report_fields_table

    report_page = DOCS / "report.md"
    out[report_page] = render_page(report_page.read_text(), {"report-json": report_fields_table(),
                                                             "report-backend-queries": queries_table()})
    return out


def stale_pages() -> list[Path]:
    return [path for path, text in expected_pages().items() if not path.exists() or path.read_text() != text]


def write_pages() -> list[Path]:
    written = []
    for path, text in expected_pages().items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_ofu.cli.docs", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any generated page is out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)}")
        if stale:
            print("regenerate with: python -m otel_ofu.cli.docs")
        return 1 if stale else 0
    for path in write_pages():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
