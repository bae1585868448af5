"""The one config loader: Collector-shaped YAML, ``${env:NAME}`` substitution, typed configs.

A component's config is a dataclass; :func:`build_config` fills it from a mapping, checking
every key and type against the dataclass's fields and hints, then calls its ``validate()``.
Every error names the file, the component and the key at fault.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import os
import re
import stat
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from otel_ofu.pipeline.redact import redact_urls


class ConfigError(Exception):
    """A config problem, located: ``file: section.component: key: message``.

    One error may carry several (``problems``): a config is checked whole and every problem
    reported at once, one per line, so a user fixes them in one pass.
    """

    def __init__(self, message: str, *, file: str | None = None, component: str | None = None,
                 key: str | None = None, problems: list[ConfigError] | None = None):
        # A value echoed in the message may be a URL with credentials: masked (pipeline/redact.py).
        self.file, self.component, self.key, self.message = file, component, key, redact_urls(message)
        self.problems: list[ConfigError] = problems or [self]
        super().__init__(self.format())

    def format(self) -> str:
        if len(self.problems) > 1:
            return f"{len(self.problems)} problems:\n" + "\n".join(f"  {p.format()}" for p in self.problems)
        where = [part for part in (self.file, self.component, self.key) if part]
        return ": ".join([*where, self.message])

    @classmethod
    def combine(cls, errors: list[ConfigError]) -> ConfigError:
        """One error for several (the first's location for callers that read only one)."""
        flat = [p for e in errors for p in e.problems]
        if len(flat) == 1:
            return flat[0]
        first = flat[0]
        return cls(first.message, file=first.file, component=first.component, key=first.key, problems=flat)

    def located(self, *, file: str | None = None, component: str | None = None) -> ConfigError:
        return ConfigError.combine([
            ConfigError(p.message, file=file or p.file, component=component or p.component, key=p.key)
            for p in self.problems])


class FieldError(ValueError):
    """Raised by a config's ``validate()``: the key at fault and what is wrong with it.

    ``all`` holds every problem found in one component (unknown keys, wrong types, missing
    required keys are all collected before giving up); it is ``[self]`` for a single one.
    """

    def __init__(self, key: str, message: str, *, all_errors: list[FieldError] | None = None):
        self.key, self.message = key, redact_urls(message)
        message = self.message
        self.all: list[FieldError] = all_errors or [self]
        super().__init__(f"{key}: {message}")

    @classmethod
    def combine(cls, errors: list[FieldError]) -> FieldError:
        flat = [e for error in errors for e in error.all]
        if len(flat) == 1:
            return flat[0]
        return cls(flat[0].key, flat[0].message, all_errors=flat)


# --- warnings about values that are valid but probably not what was meant --------------------

_warnings: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar("config_warnings",
                                                                                        default=None)

#: A bare number of seconds at or above this is ambiguous: 30000 is 8.3 hours, or 30 s in
#: milliseconds as dcgm-exporter's -c and many other tools count them.
AMBIGUOUS_SECONDS = 1000


def _warn(key: str, message: str) -> None:
    sink = _warnings.get()
    if sink is not None:
        sink.append((key, redact_urls(message)))


def _human_seconds(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:g}s"


class Duration(float):
    """Seconds; in YAML either a number or a Go-style duration string ("10s", "500ms", "1m30s")."""

    _UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    _PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")

    @classmethod
    def parse(cls, value: object) -> Duration:
        if isinstance(value, bool):
            raise ValueError(f"expected a duration like '10s', got {value!r}")
        if isinstance(value, (int, float)):
            return cls(float(value))
        if isinstance(value, str):
            text = value.strip()
            parts = cls._PART.findall(text)
            if parts and "".join(n + u for n, u in parts) == text:
                return cls(sum(float(n) * cls._UNITS[u] for n, u in parts))
        raise ValueError(f"expected a duration like '10s', '500ms' or '1m', got {value!r}")


# --- environment substitution ---------------------------------------------------------------

# As the Collector's confmap (DefaultScheme "env"): "$$" is a literal "$"; "${env:NAME}",
# "${env:NAME:-default}" and the bare "${NAME}" read the environment. A bare "${NAME:-default}"
# is an error there (NAME is taken for a URI scheme) and so here, with the fix in the message.
_ENV_REF = re.compile(r"\$\$|\$\{([^${}]*)\}")
_ENV_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(.*)", re.S)


def _env_value(body: str, environ: Mapping[str, str], path: str) -> str:
    """The value of one ``${...}`` reference (its body without the braces)."""
    scheme = _SCHEME.fullmatch(body)
    bare_name, bare_default, default_text = body.partition(":-")
    if scheme is not None and scheme.group(1) == "env":
        name, sep, default_text = scheme.group(2).partition(":-")
        default = default_text if sep else None
    elif bare_default and _ENV_NAME.fullmatch(bare_name):
        raise ConfigError(f"'${{{body}}}': a default needs the env: prefix, as in the Collector (which reads "
                          f"'{bare_name}' as a URI scheme here); write ${{env:{body}}}", key=path or None)
    elif scheme is None:  # bare ${NAME}: the Collector's default scheme is env
        name, default = body, None
    else:
        raise ConfigError(f"'${{{body}}}': otel-ofu substitutes environment variables only (${{env:NAME}}, "
                          f"${{NAME}}); the '{scheme.group(1)}:' provider is not supported", key=path or None)
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(f"'${{{body}}}': {name!r} is not an environment variable name (letters, digits, _; "
                          "not starting with a digit); write $$ for a literal $", key=path or None)
    if name in environ:
        return environ[name]
    if default is not None:
        return default
    raise ConfigError(f"environment variable {name} is not set (use ${{env:{name}:-default}} for a default)",
                      key=path or None)


def substitute_env(value: Any, environ: Mapping[str, str] | None = None, path: str = "",
                   errors: list[ConfigError] | None = None, sources: dict[str, str] | None = None) -> Any:
    """Replace ``${env:NAME}``, ``${NAME}`` and ``${env:NAME:-default}`` in every string of a YAML tree.

    A string that is exactly one reference is re-read as YAML, so ``${env:PORT}`` can be an
    int, as in the Collector. ``$$`` is a literal ``$``. An unset variable without a default
    is an error naming it; every bad reference in the document is reported, not the first only.
    ``sources``, when given, gets the key path of every substituted value with where it came
    from (:func:`env_source`), so a problem with the value can name the variable.
    """
    environ = os.environ if environ is None else environ
    top = errors is None
    errors = [] if errors is None else errors
    if isinstance(value, dict):
        out: Any = {k: substitute_env(v, environ, f"{path}.{k}" if path else str(k), errors, sources)
                    for k, v in value.items()}
    elif isinstance(value, list):
        out = [substitute_env(v, environ, f"{path}[{i}]", errors, sources) for i, v in enumerate(value)]
    elif not isinstance(value, str) or "$" not in value:
        out = value
    else:
        failed = False
        used: list[str] = []

        def replace(match: re.Match[str]) -> str:
            nonlocal failed
            if match.group(0) == "$$":
                return "$"
            try:
                found = _env_value(match.group(1), environ, path)
            except ConfigError as exc:
                errors.append(exc)
                failed = True
                return match.group(0)
            used.append(env_source(match.group(1), environ))
            return found

        whole = _ENV_REF.fullmatch(value)
        out = _ENV_REF.sub(replace, value)
        if used and sources is not None:
            sources[path] = f"{value} with {', '.join(used)}"
        if whole and whole.group(0) != "$$" and not failed:
            try:
                out = yaml.safe_load(out) if out.strip() else out
            except yaml.YAMLError:
                pass
    if top and errors:
        raise ConfigError.combine(errors)
    return out


def env_source(body: str, environ: Mapping[str, str]) -> str:
    """How one reference's value was made, for messages: ``NAME='10000'`` or ``NAME unset: default '30s'``."""
    scheme = _SCHEME.fullmatch(body)
    name, _, default = (scheme.group(2) if scheme and scheme.group(1) == "env" else body).partition(":-")
    if name in environ:
        return f"{name}={environ[name]!r}"
    return f"{name} unset: default {default!r}"


class Document(dict):
    """A config document after substitution, and the source of each substituted value by key path."""

    def __init__(self, tree: Mapping[str, Any], sources: Mapping[str, str] | None = None):
        super().__init__(tree)
        self.sources: dict[str, str] = dict(sources or {})

    def source_note(self, path: str) -> str:
        """`` (from ${env:NAME} with NAME='...')`` for a key whose value, or a value above it, came
        from the environment; "" otherwise. A reader fixes the variable, not the file."""
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            found = self.sources.get(".".join(parts[:end]))
            if found is not None:
                return f" (the value is {found})"
        return ""


# --- typed configs --------------------------------------------------------------------------

def _type_name(tp: Any) -> str:
    if tp is Duration:
        return "duration"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "list"
    if origin is dict:
        return "mapping"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def type_name(tp: Any) -> str:
    """How a config key's type reads in errors and in the generated reference (docs/components)."""
    return _type_name(tp)


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        arms = [arg for arg in args if arg is not type(None)]
        if len(arms) == 1:  # Optional[X]: X's own error names the inner key at fault
            return _convert(value, arms[0], key)
        for arg in arms:
            try:
                return _convert(value, arg, key)
            except FieldError:
                continue
        raise FieldError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise FieldError(key, f"must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
        return value
    if tp is Duration:
        try:
            parsed = Duration.parse(value)
        except ValueError as exc:
            raise FieldError(key, str(exc)) from None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= AMBIGUOUS_SECONDS:
            _warn(key, f"{value:g} is read as {value:g} seconds ({_human_seconds(parsed)}). If milliseconds were "
                       f"meant (dcgm-exporter's -c counts them), write '{value:g}ms' ({_human_seconds(value / 1000)}); "
                       f"write '{_human_seconds(parsed)}' to keep {_human_seconds(parsed)} without this warning")
        return parsed
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise FieldError(key, f"expected a mapping, got {value!r}")
        return build_config(tp, value, prefix=f"{key}.")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise FieldError(key, f"expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise FieldError(key, f"expected a mapping, got {value!r}")
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        return {_convert(k, key_tp, key): _convert(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise FieldError(key, f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise FieldError(key, f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise FieldError(key, f"expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise FieldError(key, f"expected a string, got {value!r}")
    raise FieldError(key, f"unsupported config type {tp!r}")


def build_config(cls: type, data: Mapping[str, Any] | None, prefix: str = "") -> Any:
    """Instantiate config dataclass ``cls`` from ``data``; raises FieldError naming every key at fault.

    Unknown keys, wrong types and missing required keys are all collected (``FieldError.all``),
    and ``validate()`` runs even when some keys had the wrong type (on the defaults in their
    place, its findings about those keys left out), so one run reports every problem.
    """
    data = data or {}
    if not isinstance(data, Mapping):
        raise FieldError(prefix.rstrip(".") or "config", f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    errors: list[FieldError] = []
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(sorted(fields))})"
            errors.append(FieldError(f"{prefix}{key}", f"unknown key{hint}"))
    kwargs = {}
    bad: set[str] = set()  # fields whose value could not be converted: validate() sees their defaults
    missing = False
    for name, f in fields.items():
        if name in data:
            try:
                kwargs[name] = _convert(data[name], hints[name], f"{prefix}{name}")
            except FieldError as exc:
                errors.append(exc)
                bad.add(name)
                missing |= f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append(FieldError(f"{prefix}{name}", "required key is missing"))
            missing = True
    if missing:  # a required key without a usable value: no instance to validate
        raise FieldError.combine(errors)
    instance = cls(**kwargs)
    warnings = _warnings.get()
    before = len(warnings) if warnings is not None else 0
    problems = [p for p in _validate(instance) if not _about(p, bad)]
    if warnings is not None and prefix:  # validate()'s warnings name its own keys
        warnings[before:] = [(k if k.startswith(prefix) else prefix + k, m) for k, m in warnings[before:]]
    errors += [p if not prefix or p.key.startswith(prefix) else FieldError(f"{prefix}{p.key}", p.message)
               for p in problems]
    if errors:
        raise FieldError.combine(errors)
    return instance


_problems: contextvars.ContextVar[list[FieldError] | None] = contextvars.ContextVar("config_problems", default=None)


def _validate(instance: Any) -> list[FieldError]:
    """Every problem ``instance.validate()`` finds: :func:`require` records them and goes on.

    An exception other than FieldError after a problem was found is a consequence of that
    problem (a check that assumed an earlier one passed) and ends the checks quietly; one
    before any problem is a bug and is raised.
    """
    validate = getattr(instance, "validate", None)
    if validate is None:
        return []
    found: list[FieldError] = []
    token = _problems.set(found)
    try:
        validate()
    except FieldError as exc:
        found += exc.all
    except Exception:
        if not found:
            raise
    finally:
        _problems.reset(token)
    return found


def _about(problem: FieldError, fields: set[str]) -> bool:
    """A problem about one of ``fields`` (by key, or naming it: "must be at least resolution")."""
    return any(problem.key == f or problem.key.startswith((f + ".", f + "["))
               or re.search(rf"\b{re.escape(f)}\b", problem.message) for f in fields)


def require(condition: bool, key: str, message: str) -> bool:
    """For ``validate()`` methods: unless ``condition`` holds, a problem with ``key``.

    Under :func:`build_config` the problem is recorded and validation goes on (every problem is
    reported in one run), and the result says whether the condition held; called elsewhere it
    raises FieldError(key, message).
    """
    if condition:
        return True
    error = FieldError(key, message)
    found = _problems.get()
    if found is None:
        raise error
    found.append(error)
    return False


def invalid(key: str, message: str) -> None:
    """For ``validate()`` methods: a problem with ``key`` (recorded, as by :func:`require`)."""
    require(False, key, message)


PathKind = Literal["file", "dir", "other", "missing"]


def path_kind(key: str, path: str | Path) -> PathKind:
    """What ``path`` (``~`` expanded) is, for ``validate()`` methods that check a file or directory.

    A path the system cannot even look up (a name longer than the file system allows, a loop of
    links, no permission to search a directory) is a FieldError naming ``key``, not an OSError
    out of validation (benchmarks/fuzz.py found ``File name too long`` tracebacks).
    """
    try:
        mode = Path(path).expanduser().stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FieldError(key, f"{str(path)[:80]!r}{'...' if len(str(path)) > 80 else ''}: cannot be looked up: "
                              f"{reason}") from None
    if stat.S_ISREG(mode):
        return "file"
    return "dir" if stat.S_ISDIR(mode) else "other"


def require_file(key: str, path: str | Path) -> bool:
    """``path`` must be an existing file (a certificate, a token, a kubeconfig)."""
    kind = path_kind(key, path)
    return require(kind == "file", key, f"{str(path)!r} is a directory, not a file" if kind == "dir"
                   else f"file {str(path)!r} does not exist")


def require_directory(key: str, path: str | Path, what: str) -> bool:
    """``path`` must be a directory, or one that can be created: its nearest existing ancestor is a
    directory (a file there makes ``mkdir`` fail when the component starts)."""
    target = Path(path).expanduser()
    for candidate in (target, *target.parents):
        kind = path_kind(key, candidate)
        if kind == "missing":
            continue
        where = "" if candidate == target else f" (its parent {str(candidate)!r} is not a directory)"
        return require(kind == "dir", key, f"{str(path)!r} is not a directory{where}; it names a directory for {what}")
    return True


def warn(key: str, message: str) -> None:
    """For ``validate()`` methods: a valid value that will not work where this runs (``validate``
    prints it as a warning, ``run`` logs it)."""
    _warn(key, message)


# --- the pipeline document ------------------------------------------------------------------

SECTIONS = ("receivers", "processors", "exporters")


@dataclasses.dataclass
class PipelineSpec:
    name: str
    receivers: list[str]
    processors: list[str]
    exporters: list[str]


@dataclasses.dataclass
class ServiceConfig:
    """A validated document: component configs by section and id, and the pipelines."""

    file: str
    components: dict[str, dict[str, Any]]  # section -> component id -> config instance
    pipelines: list[PipelineSpec]
    log_level: str = "info"
    exit_when_done: bool = False  # stop once every receiver that ends by itself (a replay) has ended
    warnings: list[str] = dataclasses.field(default_factory=list)  # valid, but probably not what was meant
    # service.shutdown_timeout: how long stopping may take, the final flush included (docs/reliability.md).
    shutdown_timeout: float = 20.0


def component_type(component_id: str) -> str:
    """``"file/raw"`` -> ``"file"``: the Collector's ``type[/name]`` ids."""
    return component_id.split("/", 1)[0]


MAX_EXPANDED_VALUES = 100_000  # a real config has hundreds; YAML aliases can make a few lines expand to billions


def _alias_problem(doc: Any) -> str | None:
    """A tree that YAML aliases (&a / *a) make cyclic or huge, which every later walk would hang on.

    Sizes are memoised per node, so this costs the number of distinct nodes, not their expansion
    (found by benchmarks/fuzz.py: a 12-line "billion laughs" config hung validation).
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise RecursionError
        active.add(key)
        children = node.values() if isinstance(node, dict) else node
        total = 1 + sum(size(child) for child in children)
        active.discard(key)
        sizes[key] = total
        return total

    try:
        total = size(doc)
    except RecursionError:
        return "a YAML alias (*name) refers to a node that contains it: the document is infinite"
    if total > MAX_EXPANDED_VALUES:
        return (f"the document expands to {total:,} values through YAML aliases (&name / *name), more than "
                f"{MAX_EXPANDED_VALUES:,}: write the values out")
    return None


# Component types of the OpenTelemetry Collector (core and contrib) that otel-ofu does not have:
# a config declaring one is a Collector config (tests check none is an otel-ofu type).
COLLECTOR_ONLY_TYPES: dict[str, frozenset[str]] = {
    "receivers": frozenset({
        "hostmetrics", "filelog", "kubeletstats", "k8s_cluster", "k8s_events", "k8sobjects", "jaeger", "zipkin",
        "kafka", "otlpjsonfile", "journald", "nvidiagpu", "statsd", "syslog", "opencensus", "carbon",
        "fluentforward", "receiver_creator", "prometheus_simple", "httpcheck", "docker_stats", "redis",
        "postgresql", "mysql", "awscloudwatch"}),
    "processors": frozenset({
        "batch", "memory_limiter", "filter", "transform", "resource", "attributes", "k8sattributes",
        "resourcedetection", "groupbyattrs", "groupbytrace", "probabilistic_sampler", "tail_sampling", "routing",
        "cumulativetodelta", "deltatocumulative", "deltatorate", "metricstransform", "metricsgeneration",
        "redaction", "span", "interval", "logdedup"}),
    "exporters": frozenset({
        "debug", "logging", "nop", "prometheusremotewrite", "load_balancing", "loadbalancing", "otlp_grpc",
        "otlp_http", "kafka", "loki", "elasticsearch", "googlecloud", "googlemanagedprometheus", "awsemf",
        "awsxray", "datadog", "clickhouse", "splunk_hec", "influxdb", "opensearch", "zipkin", "sapm",
        "signalfx", "azuremonitor"}),
}
# Keys of component types both have that only the Collector's component takes.
COLLECTOR_ONLY_KEYS: dict[tuple[str, str], frozenset[str]] = {
    ("exporters", "prometheus"): frozenset({"resource_constant_labels", "translation_strategy",
                                            "enable_open_metrics", "without_scope_info", "without_type_suffix",
                                            "without_units"}),
    ("receivers", "prometheus"): frozenset({"config", "api_server", "target_allocator"}),
}
COLLECTOR_VALIDATE_HINT = ("check it with the Collector: `otelcol validate --config FILE` (the repository's "
                           "collector/validate-configs.sh validates the shipped collector-config/otelcol-*.yaml "
                           "with the otelcol-ofu build); otel-ofu's own configs are in docs/config.md")


def collector_config_evidence(doc: Mapping[str, Any]) -> list[str]:
    """Why ``doc`` looks like an OpenTelemetry Collector config, not otel-ofu's (empty: it does not).

    Told by what only the Collector has: its component types (``batch``, ``memory_limiter``,
    ``debug``, ...), keys only its components take (the prometheus receiver's ``config:
    {scrape_configs: ...}``), ``extensions``/``connectors`` with components, its own telemetry
    (``service.telemetry.metrics``; otel-ofu's is the selftelemetry receiver). Checked before
    ``${env:...}`` substitution, so a Collector config's variables do not hide what it is.
    """
    evidence = []
    for section, only in COLLECTOR_ONLY_TYPES.items():
        entries = doc.get(section)
        if isinstance(entries, dict):
            found = sorted({component_type(str(k)) for k in entries} & only)
            evidence += [f"{section[:-1]} '{t}'" for t in found]
    for (section, ctype), keys in COLLECTOR_ONLY_KEYS.items():
        entries = doc.get(section)
        for comp_id, body in (entries.items() if isinstance(entries, dict) else ()):
            if component_type(str(comp_id)) == ctype and isinstance(body, dict) and set(body) & keys:
                evidence.append(f"{section[:-1]} '{comp_id}' with {', '.join(sorted(set(body) & keys))}")
    for section in ("extensions", "connectors"):
        if isinstance(doc.get(section), dict) and doc[section]:
            evidence.append(f"{section} ({', '.join(sorted(str(k) for k in doc[section]))})")
    service = doc.get("service")
    telemetry = service.get("telemetry") if isinstance(service, dict) else None
    if isinstance(telemetry, dict) and set(telemetry) - {"logs"}:  # otel-ofu's own metrics: the selftelemetry receiver
        evidence.append(f"service.telemetry.{', '.join(sorted(str(k) for k in set(telemetry) - {'logs'}))}")
    return evidence


def load_document(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError as exc:  # found by benchmarks/fuzz.py: was a traceback
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"line {line}: not UTF-8 text ({exc.reason})", file=str(path)) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{where}not valid YAML: {getattr(exc, 'problem', exc)}", file=str(path)) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("the top level must be a mapping with receivers, processors, exporters and service",
                          file=str(path))
    problem = _alias_problem(doc)
    if problem:
        raise ConfigError(problem, file=str(path))
    evidence = collector_config_evidence(doc)
    if evidence:
        raise ConfigError(f"this is an OpenTelemetry Collector config, not an otel-ofu one ({', '.join(evidence)} "
                          f"are the Collector's): {COLLECTOR_VALIDATE_HINT.replace('FILE', str(path))}",
                          file=str(path))
    sources: dict[str, str] = {}
    try:
        return Document(substitute_env(doc, sources=sources), sources)
    except ConfigError as exc:
        raise exc.located(file=str(path)) from None


def parse_service_config(doc: dict[str, Any], file: str, factories: Mapping[str, Mapping[str, Any]]) -> ServiceConfig:
    """Validate a whole document against the registered factories (section -> type -> factory).

    Every problem is collected and raised together; values that are valid but look like a
    mistake (a duration of 30000 seconds) become ``warnings``.
    """
    errors: list[ConfigError] = []
    warnings: list[str] = []

    def fail(message: str, component: str | None = None, key: str | None = None) -> None:
        errors.append(ConfigError(message, file=file, component=component, key=key))

    def note(path: str) -> str:
        return doc.source_note(path) if isinstance(doc, Document) else ""

    unknown = set(doc) - {*SECTIONS, "service", "extensions", "connectors"}
    for key in sorted(unknown):
        fail(f"unknown top-level key '{key}' (expected receivers, processors, exporters, service)")
    components: dict[str, dict[str, Any]] = {}
    declared: dict[str, set[str]] = {}  # ids configured, also those whose config has errors
    for section in SECTIONS:
        entries = doc.get(section) or {}
        declared[section] = {str(k) for k in entries} if isinstance(entries, dict) else set()
        built: dict[str, Any] = {}
        components[section] = built
        if not isinstance(entries, dict):
            fail("expected a mapping of component ids to configs", component=section)
            continue
        for comp_id, comp_data in entries.items():
            comp_id = str(comp_id)
            where = f"{section}.{comp_id}"
            ctype = component_type(comp_id)
            factory = factories[section].get(ctype)
            if factory is None:
                known = ", ".join(sorted(factories[section]))
                fail(f"unknown {section[:-1]} type '{ctype}' (known: {known})", component=where)
                continue
            sink: list[tuple[str, str]] = []
            token = _warnings.set(sink)
            try:
                built[comp_id] = build_config(factory.config_type, comp_data)
            except FieldError as exc:
                errors += [ConfigError(e.message + note(f"{where}.{e.key}"), file=file, component=where, key=e.key)
                           for e in exc.all]
            finally:
                _warnings.reset(token)
            warnings += [f"{file}: {where}: {key}: {message}{note(f'{where}.{key}')}" for key, message in sink]

    pipelines: list[PipelineSpec] = []
    log_level, exit_when_done = "info", False
    service = doc.get("service")
    if not isinstance(service, dict):
        fail("missing 'service' with 'pipelines'", component="service")
        service = {}
    allowed = {"pipelines", "telemetry", "extensions", "exit_when_done", "shutdown_timeout"}
    for key in sorted(set(service) - allowed):
        fail(f"unknown key '{key}' (expected pipelines, telemetry, exit_when_done, shutdown_timeout)",
             component="service")
    pipelines_doc = service.get("pipelines")
    if doc.get("service") is not None and (not isinstance(pipelines_doc, dict) or not pipelines_doc):
        fail("at least one pipeline is required", component="service.pipelines")
        pipelines_doc = {}
    for name, body in (pipelines_doc or {}).items():
        spec = _pipeline(str(name), body, components, declared, factories, file, errors)
        if spec is not None:
            pipelines.append(spec)

    telemetry = service.get("telemetry") or {}
    log_level = str(((telemetry.get("logs") or {}) if isinstance(telemetry, dict) else {}).get("level", "info"))
    if log_level.lower() not in ("debug", "info", "warn", "warning", "error"):
        fail(f"unknown log level '{log_level}'", component="service.telemetry.logs", key="level")
    exit_when_done = service.get("exit_when_done", False)
    if not isinstance(exit_when_done, bool):
        fail(f"expected true or false, got {exit_when_done!r}", component="service", key="exit_when_done")
    shutdown_timeout = 20.0
    try:
        shutdown_timeout = float(Duration.parse(service.get("shutdown_timeout", "20s")))
        if shutdown_timeout <= 0:
            fail("must be positive", component="service", key="shutdown_timeout")
    except (TypeError, ValueError) as exc:
        fail(str(exc), component="service", key="shutdown_timeout")
    if errors:
        raise ConfigError.combine(errors)
    return ServiceConfig(file=file, components=components, pipelines=pipelines, log_level=log_level.lower(),
                         exit_when_done=bool(exit_when_done), warnings=warnings, shutdown_timeout=shutdown_timeout)


def _pipeline(name: str, body: Any, components: dict[str, dict[str, Any]], declared: dict[str, set[str]],
              factories: Mapping[str, Mapping[str, Any]], file: str, errors: list[ConfigError]) -> PipelineSpec | None:
    where = f"service.pipelines.{name}"

    def fail(message: str, key: str | None = None) -> None:
        errors.append(ConfigError(message, file=file, component=where, key=key))

    if component_type(name) != "metrics":
        fail("otel-ofu pipelines carry metrics: name them 'metrics' or 'metrics/<name>'")
        return None
    if not isinstance(body, dict):
        fail("expected a mapping with receivers, processors and exporters")
        return None
    for key in sorted(set(body) - set(SECTIONS)):
        fail(f"unknown key '{key}'")
    lists: dict[str, list[str]] = {}
    complete = True
    for section in SECTIONS:
        ids = body.get(section) or []
        if not isinstance(ids, list):
            fail("expected a list of component ids", key=section)
            ids, complete = [], False
        for comp_id in ids:
            if str(comp_id) not in components[section]:
                if str(comp_id) not in declared[section]:  # else its own errors are reported already
                    fail(f"references '{comp_id}', which is not configured under '{section}'", key=section)
                complete = False
        repeated = sorted({str(i) for i in ids if ids.count(i) > 1})
        if repeated:
            fail(f"lists {', '.join(repeated)} more than once", key=section)
            complete = False
        if section != "processors" and not ids:
            fail(f"a pipeline needs at least one of {section}", key=section)
        lists[section] = [str(i) for i in ids]
    if complete:
        for message in processor_order_problems(lists["receivers"], lists["processors"], components, factories):
            fail(message, key="processors")
    return PipelineSpec(name, lists["receivers"], lists["processors"], lists["exporters"])


def receiver_output(factory: Any, config: Any) -> str:
    """What a receiver sends: "samples" (for the ofu processor) or "points" (ready to export)."""
    kind = getattr(config, "output_kind", None)
    return kind() if callable(kind) else getattr(factory, "output", "") or "points"


def processor_order_problems(receivers: list[str], processors: list[str], components: dict[str, dict[str, Any]],
                             factories: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What is wrong with the order of a pipeline's processors, as sentences (empty when right).

    GPU samples become metrics only in the processor that ``produces`` points from them
    (``ofu``): processors that work on samples (``attribution``) must come before it, those
    that read its points (``jobs``) after it, and a pipeline whose receivers send samples
    must have it, or nothing at all reaches the exporters.
    """
    def factory(section: str, comp_id: str) -> Any:
        return factories[section][component_type(comp_id)]

    outputs = {r: receiver_output(factory("receivers", r), components["receivers"][r]) for r in receivers}
    sample_sources = [r for r in receivers if outputs[r] == "samples"]  # "any" (otlp) may be a pass-through stage
    point_sources = [r for r in receivers if outputs[r] != "samples"]
    converters = [p for p in processors if factory("processors", p).produces == "points"
                  and factory("processors", p).consumes == "samples"]
    problems = []
    converted_by: str | None = None
    for position, pid in enumerate(processors):
        f = factory("processors", pid)
        if f.consumes == "samples" and converted_by is not None and pid not in converters:
            problems.append(f"'{pid}' comes after '{converted_by}', which has already turned the GPU samples into "
                            f"metric points: {pid} works on samples, so nothing it does reaches the output; list it "
                            f"before '{converted_by}' (e.g. [{pid}, {converted_by}])")
        if f.consumes == "points" and converted_by is None and not point_sources:
            later = [c for c in converters if processors.index(c) > position]
            fix = (f"list it after '{later[0]}' (e.g. [{later[0]}, {pid}])" if later
                   else f"add the ofu processor before it (e.g. [ofu, {pid}])")
            problems.append(f"'{pid}' reads the gpu.ofu points the ofu processor makes, but comes before any: {fix}")
        if pid in converters and converted_by is None:
            converted_by = pid
    if sample_sources and not converters:
        listed = f"[{', '.join(processors)}]" if processors else "[]"
        problems.append(f"{listed} has no ofu processor: the GPU samples of {', '.join(sample_sources)} become metrics "
                        "only there, so nothing would reach the exporters; add it (e.g. processors: [ofu])")
    return problems
