"""One finding of ``otel-ofu doctor``: what was checked, how it went, and what to do about it."""

from __future__ import annotations

from dataclasses import dataclass

OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"


@dataclass
class Check:
    name: str
    status: str  # ok | fail | warn | skip
    detail: str
    fix: str = ""
