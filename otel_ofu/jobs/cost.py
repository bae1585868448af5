"""What a GPU-hour costs: the jobs processor's ``cost`` settings and the price of each GPU window.

A job's cost is its GPU time x the price per GPU-hour of each GPU it ran on, window by window
(a job on two kinds of node pays each its own price), split by the loss account: each window's
money goes to its parts by their shares, as its GPU time does (:mod:`otel_ofu.jobs.loss`). So the
cost account is a :class:`~otel_ofu.core.loss.LossTotals` whose "seconds" are GPU-seconds x
price per GPU-hour: its ``gpu_hours()`` are money per part, its ``seconds / 3600`` all the money.
A GPU with no price has no cost (never a cost of 0): the account leaves it out and the book
counts its GPU time as unpriced, by what it would have been priced by (docs/jobs.md#cost).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from otel_ofu.core import specs
from otel_ofu.core.loss import LossTotals
from otel_ofu.core.model import HW_MODEL
from otel_ofu.pipeline.config import require

BY_MODEL = "model"
NO_VALUE = ""  # what a GPU without the attribute prices by (the default price, if any)
_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,15}")


@dataclass
class CostConfig:
    """What a GPU-hour costs (docs/jobs.md#cost): job.cost and fleet.cost in ``currency``; unset, no cost."""

    # The currency of every price, written on every cost point (ofu.cost.currency): USD, EUR, ...
    currency: str = "USD"
    # Price per GPU-hour by the value of `by`: a GPU model as the source names it ("NVIDIA H100 80GB HBM3") or as
    # docs/gpus.md's table does (h100_sxm), or an instance type, a node label, ... Keys are exact or shell-style
    # patterns ("*H100*", "p5.*"), matched case-insensitively; the first key that matches, in order, wins.
    per_gpu_hour: dict[str, float] = field(default_factory=dict)
    default: float | None = None  # the price of a GPU no key matches; unset: its GPU time has no cost
    # What the keys name: model (the GPU's hw.model), or a resource attribute of the GPU's points (the cloud instance
    # type in host.type, a node label an upstream Collector's k8sattributes processor put there).
    by: str = BY_MODEL

    def validate(self) -> None:
        require(bool(_CURRENCY.fullmatch(self.currency)), "currency",
                f"a currency code such as USD or EUR (letters, digits, _ . -; at most 16), got {self.currency!r}")
        require(bool(self.by.strip()), "by", "must be 'model' or a resource attribute name (such as host.type)")
        for key, price in self.per_gpu_hour.items():
            require(bool(key), "per_gpu_hour", "a model, value or pattern must not be empty")
            require(price > 0 and price < float("inf"), f"per_gpu_hour.{key}",
                    f"a price per GPU-hour is above 0, got {price} (leave a GPU out to give it no cost)")
        if self.default is not None:
            require(0 < self.default < float("inf"), "default",
                    f"a price per GPU-hour is above 0, got {self.default} (leave it unset for no default)")

    @property
    def enabled(self) -> bool:
        """Whether any GPU can have a price."""
        return bool(self.per_gpu_hour) or self.default is not None


class Pricer:
    """The price per GPU-hour of a GPU from its points' attributes (resource and point in one dict), by ``cost.by``.

    Worked out once per value (a fleet has a few models or instance types); bounded all the same.
    """

    MAX_VALUES = 4096

    def __init__(self, config: CostConfig):
        self.config = config
        self._patterns = [(re.compile(fnmatch.translate(key.lower())), price)
                          for key, price in config.per_gpu_hour.items()]
        self._found: dict[str, float | None] = {}

    def __reduce__(self) -> tuple:
        """Saved (jobs.state) as its settings: the compiled patterns are made again on loading."""
        return Pricer, (self.config,)

    def key(self, attributes: dict) -> str:
        """What a GPU is priced by: its model, or the ``by`` attribute's value ("" when it has none)."""
        value = attributes.get(HW_MODEL if self.config.by == BY_MODEL else self.config.by)
        return NO_VALUE if value is None else str(value)

    def price(self, key: str) -> float | None:
        """The price per GPU-hour of a GPU priced by ``key``; None: no price."""
        if key in self._found:
            return self._found[key]
        found = self._match(key)
        if len(self._found) >= self.MAX_VALUES:
            self._found.clear()
        self._found[key] = found
        return found

    def _match(self, key: str) -> float | None:
        names = [key.lower()] if key else []
        if key and self.config.by == BY_MODEL:
            spec = specs.find_spec(key)
            if spec is not None:
                names.append(spec.key.lower())
        for pattern, price in self._patterns:
            if any(pattern.match(name) for name in names):
                return price
        return self.config.default


def money(account: LossTotals) -> dict[str, float]:
    """A cost account's money per part (what each loss part lost, ``useful`` and ``unallocated`` too)."""
    return account.gpu_hours()


def money_gained(account: LossTotals) -> dict[str, float]:
    """A cost account's money gained per part (``clock``: the SM clock boosting above f_ref)."""
    return account.gained_gpu_hours()


def total(account: LossTotals) -> float:
    """All the money of a cost account: the parts less what they gained."""
    return account.seconds / 3600.0
