"""The one config loader: Collector-shaped YAML, ``${env:NAME}`` substitution, typed configs.

A component's config is a dataclass; :func:`build_config` fills it from a mapping, checking
every key and type against the dataclass's fields and hints, then calls its ``validate()``.
Every error names the file, the component and the key at fault.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml


class ConfigError(Exception):
    """A config problem, located: ``file: section.component: key: message``."""

    def __init__(self, message: str, *, file: str | None = None, component: str | None = None,
                 key: str | None = None):
        self.file, self.component, self.key, self.message = file, component, key, message
        super().__init__(self.format())

    def format(self) -> str:
        where = [part for part in (self.file, self.component, self.key) if part]
        return ": ".join([*where, self.message])

    def located(self, *, file: str | None = None, component: str | None = None) -> ConfigError:
        return ConfigError(self.message, file=file or self.file, component=component or self.component, key=self.key)


class FieldError(ValueError):
    """Raised by a config's ``validate()``: the key at fault and what is wrong with it."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")


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

_ENV_REF = re.compile(r"\$\$|\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def substitute_env(value: Any, environ: Mapping[str, str] | None = None, path: str = "") -> Any:
    """Replace ``${env:NAME}`` / ``${env:NAME:-default}`` in every string of a parsed YAML tree.

    A string that is exactly one reference is re-read as YAML, so ``${env:PORT}`` can be an
    int, as in the Collector. ``$$`` is a literal ``$``. An unset variable without a default
    is an error naming it.
    """
    environ = os.environ if environ is None else environ
    if isinstance(value, dict):
        return {k: substitute_env(v, environ, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, environ, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"environment variable {name} is not set (use ${{env:{name}:-default}} for a default)",
                          key=path or None)

    whole = _ENV_REF.fullmatch(value)
    replaced = _ENV_REF.sub(replace, value)
    if whole and whole.group(0) != "$$":
        try:
            return yaml.safe_load(replaced) if replaced.strip() else replaced
        except yaml.YAMLError:
            return replaced
    return replaced


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
            return Duration.parse(value)
        except ValueError as exc:
            raise FieldError(key, str(exc)) from None
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
    """Instantiate config dataclass ``cls`` from ``data``; raises FieldError naming the key."""
    data = data or {}
    if not isinstance(data, Mapping):
        raise FieldError(prefix.rstrip(".") or "config", f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(sorted(fields))})"
            raise FieldError(f"{prefix}{key}", f"unknown key{hint}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], f"{prefix}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise FieldError(f"{prefix}{name}", "required key is missing")
    instance = cls(**kwargs)
    validate = getattr(instance, "validate", None)
    if validate is not None:
        try:
            validate()
        except FieldError as exc:
            if prefix and not exc.key.startswith(prefix):
                raise FieldError(f"{prefix}{exc.key}", exc.message) from None
            raise
    return instance


def require(condition: bool, key: str, message: str) -> None:
    """For ``validate()`` methods: raise FieldError(key, message) unless condition holds."""
    if not condition:
        raise FieldError(key, message)


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


def component_type(component_id: str) -> str:
    """``"file/raw"`` -> ``"file"``: the Collector's ``type[/name]`` ids."""
    return component_id.split("/", 1)[0]


def load_document(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", file=str(path)) from None
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
    try:
        return substitute_env(doc)
    except ConfigError as exc:
        raise exc.located(file=str(path)) from None


def parse_service_config(doc: dict[str, Any], file: str, factories: Mapping[str, Mapping[str, Any]]) -> ServiceConfig:
    """Validate a whole document against the registered factories (section -> type -> factory)."""
    unknown = set(doc) - {*SECTIONS, "service", "extensions", "connectors"}
    if unknown:
        raise ConfigError(f"unknown top-level key '{sorted(unknown)[0]}' (expected receivers, processors, exporters, "
                          "service)", file=file)
    components: dict[str, dict[str, Any]] = {}
    for section in SECTIONS:
        entries = doc.get(section) or {}
        if not isinstance(entries, dict):
            raise ConfigError("expected a mapping of component ids to configs", file=file, component=section)
        built = {}
        for comp_id, comp_data in entries.items():
            comp_id = str(comp_id)
            where = f"{section}.{comp_id}"
            ctype = component_type(comp_id)
            factory = factories[section].get(ctype)
            if factory is None:
                known = ", ".join(sorted(factories[section]))
                raise ConfigError(f"unknown {section[:-1]} type '{ctype}' (known: {known})", file=file, component=where)
            try:
                built[comp_id] = build_config(factory.config_type, comp_data)
            except FieldError as exc:
                raise ConfigError(exc.message, file=file, component=where, key=exc.key) from None
        components[section] = built

    service = doc.get("service")
    if not isinstance(service, dict):
        raise ConfigError("missing 'service' with 'pipelines'", file=file, component="service")
    unknown = set(service) - {"pipelines", "telemetry", "extensions"}
    if unknown:
        raise ConfigError(f"unknown key '{sorted(unknown)[0]}'", file=file, component="service")
    pipelines_doc = service.get("pipelines")
    if not isinstance(pipelines_doc, dict) or not pipelines_doc:
        raise ConfigError("at least one pipeline is required", file=file, component="service.pipelines")
    pipelines = []
    for name, body in pipelines_doc.items():
        where = f"service.pipelines.{name}"
        if component_type(str(name)) != "metrics":
            raise ConfigError("otel-ofu pipelines carry metrics: name them 'metrics' or 'metrics/<name>'",
                              file=file, component=where)
        if not isinstance(body, dict):
            raise ConfigError("expected a mapping with receivers, processors and exporters", file=file, component=where)
        extra = set(body) - set(SECTIONS)
        if extra:
            raise ConfigError(f"unknown key '{sorted(extra)[0]}'", file=file, component=where)
        lists = {}
        for section in SECTIONS:
            ids = body.get(section) or []
            if not isinstance(ids, list):
                raise ConfigError("expected a list of component ids", file=file, component=where, key=section)
            for comp_id in ids:
                if str(comp_id) not in components[section]:
                    raise ConfigError(f"references '{comp_id}', which is not configured under '{section}'",
                                      file=file, component=where, key=section)
            if section != "processors" and not ids:
                raise ConfigError(f"a pipeline needs at least one of {section}", file=file, component=where,
                                  key=section)
            lists[section] = [str(i) for i in ids]
        pipelines.append(PipelineSpec(str(name), lists["receivers"], lists["processors"], lists["exporters"]))

    telemetry = service.get("telemetry") or {}
    log_level = str(((telemetry.get("logs") or {}) if isinstance(telemetry, dict) else {}).get("level", "info"))
    if log_level.lower() not in ("debug", "info", "warn", "warning", "error"):
        raise ConfigError(f"unknown log level '{log_level}'", file=file, component="service.telemetry.logs",
                          key="level")
    return ServiceConfig(file=file, components=components, pipelines=pipelines, log_level=log_level.lower())
