"""Sums whose result does not depend on the order of their terms: each term a whole number of 2^-64.

Float addition rounds at every step, so ``(a + b) + c`` and ``(a + c) + b`` can differ in the
last bit. The jobs processor adds GPU windows in the order they arrive, and that order is not
the same after a restart or through a gateway's two lanes: a window re-sent with the same
inputs came out one bit apart, and Prometheus refuses a sample that changes the value already
stored at its timestamp (``duplicate sample for timestamp``). So every running sum a job's
values come from is kept here as an integer count of 2^-64:

- a term is held exactly when its magnitude is at least 2^-12 (its last bit is then no finer
  than 2^-64); a smaller one is cut towards zero to a multiple of 2^-64, the same way in any
  order. Integer addition is exact, so a sum is the same whatever the order of its terms;
- :func:`to_float` reads a sum back correctly rounded: the float nearest the exact sum, as
  ``math.fsum`` would give it.

A term that overflowed to infinity (a hostile input's product) is held as a count beyond
every double, which reads back as infinity; a NaN term counts as nothing. Pure, no I/O.
"""

from __future__ import annotations

import math

SCALE_BITS = 64
SCALE = float(1 << SCALE_BITS)  # hot loops inline int(x * SCALE), falling back to exact() on its errors
UNSCALE = 1.0 / SCALE  # 2^-64, exactly
# Beyond any finite double's count (2^1024 x 2^64): what an infinite term adds.
_INFINITE = 1 << (1024 + SCALE_BITS + 1)


def exact(x: float) -> int:
    """``x`` as an integer count of 2^-64 (see the module's docstring for what is exact)."""
    try:
        return int(x * SCALE)
    except OverflowError:  # x * 2^64 overflowed: a finite x that large is whole already, or x is infinite
        if math.isinf(x):
            return _INFINITE if x > 0 else -_INFINITE
        return int(x) << SCALE_BITS
    except ValueError:  # NaN
        return 0


def to_float(count: int) -> float:
    """A sum of :func:`exact` terms as the float nearest its exact value."""
    try:
        return count * UNSCALE  # the int converts to the nearest double, then an exact power-of-two scaling
    except OverflowError:  # a count beyond 2^1024: divided as integers, correctly rounded too
        try:
            return count / (1 << SCALE_BITS)
        except OverflowError:  # beyond every double (an infinite term in it)
            return math.inf if count > 0 else -math.inf


def exact_sum(values: list[float]) -> float:
    """The sum of ``values``, the same in any order (a plain float sum of the exact terms)."""
    return to_float(sum(map(exact, values)))
