"""The reference is the code: generated pages up to date, every key explained, defaults as the
loader makes them, every attribute registered, every link alive.

``python -m otel_ofu.cli.docs`` regenerates what these tests find out of date.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml

from otel_ofu.cli import docs
from otel_ofu.core import attributes, metrics
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import build_config

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otel_ofu"
DATA = Path(__file__).parent / "data"

# What otel-ofu validate needs beyond an empty block, per component (the keys it calls required).
REQUIRED: dict[str, dict[str, Any]] = {
    "receivers/dcgm_exporter": {"endpoint": "http://127.0.0.1:9400/metrics"},
    "receivers/prometheus": {"endpoint": "http://127.0.0.1:8000/metrics"},
    "receivers/replay": {"path": str(DATA / "replay" / "h100-dmon.txt")},
    "exporters/file": {"path": "ofu.jsonl"},
}
# Metrics the service itself counts for every component: on docs/metrics.md, on no component's page.
SERVICE_METRICS = {"otel_ofu.receiver.accepted", "otel_ofu.pipeline.dropped"}


def components() -> list[tuple[str, str, Any]]:
    return [(section, ctype, factory) for section, table in registry.factories().items()
            for ctype, factory in sorted(table.items())]


COMPONENTS = components()
IDS = [f"{s}/{t}" for s, t, _ in COMPONENTS]


# --- generated pages --------------------------------------------------------------------------

def test_generated_pages_are_up_to_date():
    stale = [str(p.relative_to(ROOT)) for p in docs.stale_pages()]
    assert not stale, f"out of date (run python -m otel_ofu.cli.docs): {stale}"


def test_check_command_exits_zero_when_up_to_date():
    done = subprocess.run([sys.executable, "-m", "otel_ofu.cli.docs", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_pages_do_not_depend_on_which_module_was_imported_first():
    """Components register metrics as they are imported: a test run imports them in another
    order than the command does, and the pages must come out the same."""
    modules = sorted({m for ms in registry.COMPONENT_MODULES.values() for m in ms}, reverse=True)
    script = "".join(f"import {m}\n" for m in ["otel_ofu.scrape.client", "otel_ofu.attribution.k8s_api",
                                                 "otel_ofu.gpu.status", *modules])
    script += "from otel_ofu.cli import docs\nprint(docs.stale_pages())\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def docs_copy(tmp_path, monkeypatch):
    """The generator pointed at a copy of docs/, to break it on purpose."""
    copy = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", copy)
    monkeypatch.setattr(docs, "DOCS", copy)
    monkeypatch.setattr(docs, "COMPONENT_DOCS", copy / "components")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    return copy


def test_check_finds_a_hand_edited_table_and_rewriting_keeps_hand_written_text(docs_copy):
    page = docs_copy / "components" / "receivers" / "nvml.md"
    original = page.read_text()
    assert docs.stale_pages() == []
    edited = original.replace("| `mig` | bool | `true` |", "| `mig` | bool | `false` |")
    assert edited != original
    page.write_text(edited + "\nA note written by hand.\n")
    assert docs.stale_pages() == [page]
    docs.write_pages()
    assert page.read_text() == original + "\nA note written by hand.\n"


def test_check_finds_a_new_component_without_a_page(docs_copy):
    (docs_copy / "components" / "exporters" / "file.md").unlink()
    stale = docs.stale_pages()
    assert docs_copy / "components" / "exporters" / "file.md" in stale


# --- config keys ------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "ctype", "factory"), COMPONENTS, ids=IDS)
def test_every_config_key_has_a_meaning(section, ctype, factory):
    keys = docs.config_keys(factory.config_type)
    assert keys
    missing = [k.key for k in keys if not k.description.strip()]
    assert not missing, f"{section}.{ctype}: write a comment beside (or above) these fields: {missing}"


@dataclasses.dataclass
class _Inner:
    """What the inner block is."""

    size: int = 1


@dataclasses.dataclass
class _Config:
    # Explained above.
    explained: int = 1
    # A group of keys:
    first: int = 1  # the first
    second: int = 2

    unexplained: str = ""
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    loose: Annotated[Any, _Inner] = None  # parsed in validate(); documented as _Inner


def test_a_key_without_a_comment_is_found():
    keys = {k.key: k.description for k in docs.config_keys(_Config)}
    assert keys["explained"] == "Explained above."
    assert keys["first"] == "A group of keys: the first"
    assert keys["second"] == "A group of keys:"
    assert keys["unexplained"] == ""  # the blank line ended the group
    assert keys["inner"] == "What the inner block is."
    assert keys["inner.size"] == ""
    assert keys["loose"] == "parsed in validate(); documented as _Inner"
    assert "loose.size" in keys


@pytest.mark.parametrize(("section", "ctype", "factory"), COMPONENTS, ids=IDS)
def test_every_component_has_a_page_with_hand_written_sections(section, ctype, factory):
    page = docs.page_path(section, ctype)
    assert page.exists(), f"no page for {section}/{ctype}: run python -m otel_ofu.cli.docs"
    text = page.read_text()
    for block in ("about", "config", "sample", "metrics"):
        assert f"<!-- generated:{block} -->" in text, f"{page.name}: block {block} missing"
    hand = docs._BLOCK.sub("", text)
    headings = set(re.findall(r"^## (.+)$", hand, re.M)) - {"Configuration", "Sample", "Metrics"}
    assert headings, f"{page}: no hand-written section beside the generated ones"
    assert f"[`{ctype}`]({section}/{ctype}.md)" in (docs.COMPONENT_DOCS / "README.md").read_text()


def _flatten(instance: Any, prefix: str = "") -> dict[str, Any]:
    """A built config as dotted keys -> values; lists of mappings are left whole."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(_flatten(value, f"{key}."))
        else:
            out[key] = value
    return out


def _page_defaults(section: str, ctype: str) -> dict[str, str]:
    """The key -> default column of a component page's generated table, as written on disk."""
    text = docs.page_path(section, ctype).read_text()
    table = text.split("<!-- generated:config -->")[1].split("<!-- /generated:config -->")[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`"):
            out[cells[0].strip("`")] = cells[2].strip("`")
    return out


@pytest.mark.parametrize(("section", "ctype", "factory"), COMPONENTS, ids=IDS)
def test_documented_defaults_are_what_the_loader_makes(section, ctype, factory, monkeypatch):
    """otel-ofu validate and the docs cannot disagree: each default on the page is the value
    build_config gives that key when the block sets only what must be set."""
    for name in [n for n in __import__("os").environ if n.startswith("OTEL_EXPORTER_OTLP")]:
        monkeypatch.delenv(name)
    required = REQUIRED.get(f"{section}/{ctype}", {})
    if not required:
        build_config(factory.config_type, {})  # no required key: an empty block is valid
    built = _flatten(build_config(factory.config_type, dict(required)))
    shown = _page_defaults(section, ctype)
    assert shown, "no config table on the page"
    for key, value in built.items():
        assert key in shown, f"{key} is a config key but not on the page"
        if key in required:
            assert shown[key] == "(required)", key
        elif not dataclasses.is_dataclass(value):
            assert shown[key] == docs.format_default(value, key).replace("|", "\\|"), key
    absent = tuple(f"{k}." for k, v in built.items() if type(v).__name__ == "_Unset")  # a block left out
    listed = {k for k in shown if "[]" not in k and not k.startswith(absent)}  # (its keys are its schema's)
    assert listed - set(built) <= {k for k, v in shown.items() if v == ""}, "the page lists keys the loader lacks"


# --- metrics and attributes -------------------------------------------------------------------

def test_every_metric_is_on_a_component_page():
    registry.factories()
    shown = set()
    for section, ctype, _ in COMPONENTS:
        shown |= set(re.findall(r"^\| `([^`]+)` \| `", docs.page_path(section, ctype).read_text(), re.M))
    missing = sorted(set(metrics.METRICS) - shown - SERVICE_METRICS)
    assert not missing, f"no component page lists {missing}: set emitted_by on their MetricInfo"


def test_every_point_attribute_names_registered_metrics():
    registry.factories()
    for info in attributes.ATTRIBUTES.values():
        assert info.on in (attributes.RESOURCE, attributes.POINT), info.name
        unknown = [m for m in info.metrics if m not in metrics.METRICS]
        assert not unknown, f"{info.name}: {unknown}"
        for component in info.set_by:
            section, ctype = component.split("/")
            assert ctype in registry.factories()[section], f"{info.name}: {component}"


def _string_constants(module_path: Path) -> dict[str, str]:
    tree = ast.parse(module_path.read_text())
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _defined_attribute_names() -> set[str]:
    """Attribute names the code defines as constants or sets as literal resource/attribute keys."""
    names = set()
    model = _string_constants(PACKAGE / "core" / "model.py")
    names |= {v for k, v in model.items() if "." in v and k != "NO_JOB"}
    attribution = _string_constants(PACKAGE / "attribution" / "__init__.py")
    names |= {v if not v.endswith(".") else v + "<key>" for v in attribution.values() if "." in v}
    findings = _string_constants(PACKAGE / "jobs" / "findings.py")
    names |= {v for k, v in findings.items() if k in ("WINDOW", "FINDING_KIND", "FINDING_CAUSE")}
    from otel_ofu.core import dcgm_fields
    from otel_ofu.receivers import prometheus
    names |= set(dcgm_fields._K8S_LABELS.values()) | set(prometheus.IDENTITY_LABELS.values())
    for path in PACKAGE.rglob("*.py"):
        if {"report", "console", "cli", "training"} & set(path.relative_to(PACKAGE).parts):
            continue  # readers and the training helper's own resource, not what the pipeline sets
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("resource", "attributes") and \
                    isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
    return names


def _telemetry_attribute_names() -> set[tuple[str, str]]:
    """(file, keyword) of every telemetry.add/set call: self-telemetry's point attributes."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("add", "set"):
                owner = ast.unparse(node.func.value)
                if owner.endswith("telemetry"):
                    found |= {(path.name, kw.arg) for kw in node.keywords if kw.arg}
    return found


def test_every_attribute_the_code_sets_is_registered():
    defined = _defined_attribute_names()
    assert {"hw.id", "ofu.job.id", "k8s.pod.name", "gpu.pci_bus_id", "dcgm.entity", "ofu.window"} <= defined
    missing = sorted(defined - set(attributes.ATTRIBUTES))
    assert not missing, f"add to otel_ofu/core/attributes.py: {missing}"
    telemetry = _telemetry_attribute_names()
    assert ("sender.py", "exporter") in telemetry
    missing = sorted({kw for _, kw in telemetry} - set(attributes.ATTRIBUTES))
    assert not missing, f"self-telemetry attributes missing from otel_ofu/core/attributes.py: {missing}"


def test_metric_and_attribute_tables_cover_both_registries():
    registry.factories()
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in metrics.METRICS:
        assert f"| `{name}` |" in text, name
    for name in attributes.ATTRIBUTES:
        assert f"| `{name}` |" in text, name


# --- links ------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped (hyphens and underscores kept), spaces to -."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading counts by its text
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text()), re.M):
        slug = github_anchor(match.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out |= set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", path.read_text()))
    return out


def broken_links(path: Path) -> list[str]:
    """Relative links in a Markdown file whose file, or heading anchor, does not exist."""
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.name}")
    return problems


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    problems = broken_links(path)
    assert not problems, f"{path.relative_to(ROOT)}: {problems}"


def test_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## The `otel-ofu run` command, without --config\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md) [ok](other.md#the-otel-ofu-run-command-without---config) [self](#here)\n"
                    "[gone](missing.md) [no anchor](other.md#nowhere) ![img](img.png) [web](https://x.org/a)\n"
                    "`[code](not-a-link.md)`\n\n## Here\n\n```\n[fenced](also-not.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nowhere: no heading #nowhere in other.md",
                                  "img.png: no such file"]


def test_github_anchor_matches_githubs_rules():
    assert github_anchor("`otel-ofu run` without `--config`") == "otel-ofu-run-without---config"
    assert github_anchor("Delivery guarantees") == "delivery-guarantees"
    assert github_anchor("`dcgm_exporter`: scrape dcgm-exporter `/metrics`") == \
        "dcgm_exporter-scrape-dcgm-exporter-metrics"
    assert github_anchor("Regression alarms (`kind: regression`, cause `sustained_ofu_drop`)") == \
        "regression-alarms-kind-regression-cause-sustained_ofu_drop"


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"]
    missing = [p for p in pages if f"]({p})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"
    assert "](components/README.md)" in index




# --- config snippets: what a reader copies must validate -------------------------------------

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```ya?ml[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
# What the docs tell a deployment to set (the node name from the downward API); any other
# ${env:NAME} a snippet uses without a default stands for a value the reader supplies.
_DOCUMENTED_ENV = {"K8S_NODE_NAME": "node-1"}


def _readers_environment(text: str) -> dict[str, str]:
    """The environment a snippet is checked in: this process's, what the docs tell a deployment to
    set, and a placeholder for each variable the snippet uses without a default (the reader's own)."""
    unset = {m[1] for m in re.finditer(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}", text)}
    return {**{name: "placeholder" for name in unset}, **_DOCUMENTED_ENV, **os.environ}


def config_snippets() -> list[tuple[str, str]]:
    """(file:line, text) of every YAML block in README.md and docs/ that is a config or part of one (top-level
    receivers, processors, exporters or service: otel-ofu's or the Collector's); Helm values, manifests are not."""
    from otel_ofu.pipeline.config import SECTIONS

    out = []
    for path in markdown_files():
        text = path.read_text()
        for match in _FENCE.finditer(text):
            body = "\n".join(line[len(match["indent"]):] for line in match["body"].splitlines())
            try:
                doc = yaml.safe_load(body)
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict) and set(doc) & {*SECTIONS, "service"}:
                line = text[:match.start()].count("\n") + 1
                out.append((f"{path.relative_to(ROOT)}:{line}", body))
    return out


def _machine_specific(message: str) -> bool:
    """A file or directory the snippet names is not on this machine: the reader's own paths."""
    return "does not exist" in message


@pytest.mark.parametrize("where, text", config_snippets(), ids=[w for w, _ in config_snippets()])
def test_every_config_snippet_in_the_docs_validates(where, text, monkeypatch):
    """A snippet with service.pipelines must be a whole config that `otel-ofu validate` passes (as
    written: docs/audit.md's join pipeline named an exporter it did not configure); a snippet of a
    few components must have every key right. In a Collector config, the blocks of components
    otel-ofu also has must be right for otel-ofu too (a block moves between the two unchanged),
    but for those with keys only the Collector's takes. Only paths of the reader's machine are not
    checked."""
    from otel_ofu.pipeline.config import (
        COLLECTOR_ONLY_KEYS,
        SECTIONS,
        ConfigError,
        FieldError,
        build_config,
        collector_config_evidence,
        component_type,
        parse_service_config,
        substitute_env,
    )

    for name, value in _DOCUMENTED_ENV.items():  # read by validate() too (the Kubernetes source's node name)
        monkeypatch.setenv(name, value)
    collector = bool(collector_config_evidence(yaml.safe_load(text)))
    doc = substitute_env(yaml.safe_load(text), _readers_environment(text))
    problems: list[str] = []
    if not collector and isinstance(doc.get("service"), dict) and "pipelines" in doc["service"]:
        try:
            parse_service_config(doc, where, registry.factories())
        except ConfigError as exc:
            problems = [p.format() for p in exc.problems if not _machine_specific(p.message)]
    else:
        for section in SECTIONS:
            for comp_id, body in (doc.get(section) or {}).items():
                factory = registry.factories()[section].get(component_type(str(comp_id)))
                if collector and (factory is None or not isinstance(body, dict) or set(body) & COLLECTOR_ONLY_KEYS.get(
                        (section, component_type(str(comp_id))), frozenset())):
                    continue  # the Collector's own component or keys
                if factory is None:
                    problems.append(f"{section}.{comp_id}: no such {section[:-1]} type")
                    continue
                try:
                    build_config(factory.config_type, body)
                except FieldError as exc:
                    problems += [f"{section}.{comp_id}: {e}" for e in exc.all if not _machine_specific(e.message)]
    assert not problems, "\n".join(problems)


def test_the_snippet_check_reads_indented_blocks_and_finds_the_join_pipeline():
    snippets = dict(config_snippets())
    assert len(snippets) > 30
    assert any(w.startswith("docs/audit.md") and "prometheus:" in t and "endpoint" in t for w, t in snippets.items())
    assert any(w.startswith("docs/audit.md") and "dcgm_exporter" in t and "service:" in t for w, t in snippets.items())


def shortened_paths(path: Path) -> list[str]:
    """Code spans naming a shipped file (deploy/, collector-config/) by only the end of its path.

    ``examples/fleet.yaml`` in docs/deploy.md is ``deploy/helm/otel-ofu/examples/fleet.yaml``: a
    reader at the repository root finds no such file. Shipped files are written from the root.
    """
    shipped = [p.relative_to(ROOT).as_posix() for top in ("deploy", "collector-config")
               for p in (ROOT / top).rglob("*") if p.is_file()]
    problems = []
    for span in sorted(set(re.findall(r"`([\w.\-]+(?:/[\w.\-]+)+)`", path.read_text()))):
        if (ROOT / span).exists():
            continue
        full = [p for p in shipped if p.endswith("/" + span)]
        if full:
            problems.append(f"`{span}`: write `{full[0]}`")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_files_are_named_from_the_repository_root(path):
    problems = shortened_paths(path)
    assert not problems, f"{path.relative_to(ROOT)}: {problems}"
