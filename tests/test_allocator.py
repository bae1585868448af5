"""glibc malloc settings of a running service (otel_ofu.pipeline.memory.tune_allocator)."""

from __future__ import annotations

import pytest

from otel_ofu.pipeline.memory import ALLOCATOR_ENVIRONMENT, ALLOCATOR_SETTINGS, tune_allocator


class FakeMallopt:
    """glibc's mallopt(int param, int value): 1 on success, 0 for a value it refuses."""

    def __init__(self, refuse: int | None = None):
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def __call__(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return 0 if parameter == self.refuse else 1


def test_every_setting_is_made_when_the_operator_set_none():
    mallopt = FakeMallopt()
    assert tune_allocator({"PATH": "/usr/bin"}, mallopt) is True
    assert mallopt.calls == list(ALLOCATOR_SETTINGS.items())


@pytest.mark.parametrize("name", ALLOCATOR_ENVIRONMENT)
def test_the_operators_own_malloc_settings_are_left_be(name):
    mallopt = FakeMallopt()
    assert tune_allocator({name: "1"}, mallopt) is False
    assert mallopt.calls == []


def test_without_mallopt_nothing_is_set():
    assert tune_allocator({}, None) is False


def test_a_setting_the_allocator_refuses_is_reported_and_the_others_still_made():
    refused = next(iter(ALLOCATOR_SETTINGS))
    mallopt = FakeMallopt(refuse=refused)
    assert tune_allocator({}, mallopt) is False
    assert mallopt.calls == list(ALLOCATOR_SETTINGS.items())
