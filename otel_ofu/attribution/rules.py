"""Static attribution rules from config: for GPUs no scheduler names, and for precisions no
job metadata gives.

A rule matches on any of GPU UUID, host and resource attributes (all given criteria must hold;
values are exact or shell globs, UUIDs case-insensitive) and sets a job id and/or precision.
Rules are tried in order; the first rule that sets a job id gives the job id, the first that
sets a precision gives the precision.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core import specs
from otel_ofu.pipeline.config import require


@dataclass
class RuleMatchConfig:
    """What a GPU must match for the rule to apply (every key given must match; at least one)."""

    uuid: str = ""  # GPU UUID (or glob), case-insensitive
    host: str = ""  # host name, exact or glob ("gpu-node-*")
    # Resource/point attribute -> value or glob; discovered attributes count
    # ({k8s.namespace.name: "fp8-*"} works with the kubelet source).
    attributes: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        require(bool(self.uuid or self.host or self.attributes), "match", "give at least one of uuid, host, attributes")


@dataclass
class RuleConfig:
    """A rule: job id and/or precision for the GPUs it matches. Rules are tried in order; the
    first that sets a job id gives the job id, the first that sets a precision the precision."""

    match: RuleMatchConfig = field(default_factory=RuleMatchConfig)
    job_id: str = ""  # the ofu.job.id to give, as written
    precision: str = ""  # the ofu.precision to give (bf16, fp8, ...; spellings are normalised)
    # Beat what schedulers and job metadata say (and the sample's own job/precision).
    override: bool = False

    def validate(self) -> None:
        self.match.validate()
        require(bool(self.job_id or self.precision), "job_id", "a rule sets job_id, precision or both")
        require(not self.precision or specs.normalize_precision(self.precision) != specs.UNKNOWN_PRECISION,
                "precision", f"unknown precision {self.precision!r} (known: {', '.join(specs.PRECISIONS)})")


def _glob(value: object, pattern: str, *, fold: bool = False) -> bool:
    if value is None:
        return False
    text = str(value)
    if fold:
        text, pattern = text.lower(), pattern.lower()
    return text == pattern or fnmatch.fnmatchcase(text, pattern)


def matches(rule: RuleConfig, uuid: str, host: str, attributes: Mapping[str, Any]) -> bool:
    m = rule.match
    if m.uuid and not _glob(uuid, m.uuid, fold=True):
        return False
    if m.host and not _glob(host, m.host):
        return False
    return all(_glob(attributes.get(k), v) for k, v in m.attributes.items())


@dataclass(frozen=True)
class RuleResult:
    job_id: str | None = None
    precision: str | None = None  # normalised
    job_override: bool = False
    precision_override: bool = False


def evaluate(rules: list[RuleConfig], uuid: str, host: str, attributes: Mapping[str, Any]) -> RuleResult:
    job = precision = None
    job_override = precision_override = False
    for rule in rules:
        if (job is not None and precision is not None) or not matches(rule, uuid, host, attributes):
            continue
        if rule.job_id and job is None:
            job, job_override = rule.job_id, rule.override
        if rule.precision and precision is None:
            precision, precision_override = specs.normalize_precision(rule.precision), rule.override
    return RuleResult(job, precision, job_override, precision_override)
