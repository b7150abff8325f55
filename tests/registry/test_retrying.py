"""``call_with_retries``: what it retries, for how long, and what it raises."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from registry.backends.retrying import call_with_retries


class Flaky(Exception):
    pass


def _failing(times: int, exc: Exception) -> tuple[list[float], Callable[[], str]]:
    calls: list[float] = []

    def fn() -> str:
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise exc
        return "answer"

    return calls, fn


def _is_flaky(exc: BaseException) -> bool:
    return isinstance(exc, Flaky)


def test_a_call_that_succeeds_is_made_once() -> None:
    calls, fn = _failing(0, Flaky())
    assert call_with_retries(fn, transient=_is_flaky, budget=5.0) == "answer"
    assert len(calls) == 1


def test_transient_failures_are_retried_with_backoff() -> None:
    calls, fn = _failing(3, Flaky())
    assert call_with_retries(fn, transient=_is_flaky, budget=5.0) == "answer"
    assert len(calls) == 4
    assert calls[-1] - calls[1] >= 0.02  # the retries after the first wait, growing


def test_other_failures_are_raised_at_once() -> None:
    calls, fn = _failing(1, KeyError("no"))
    with pytest.raises(KeyError):
        call_with_retries(fn, transient=_is_flaky, budget=5.0)
    assert len(calls) == 1


def test_the_budget_bounds_the_retries_and_the_last_failure_is_raised() -> None:
    calls, fn = _failing(1_000_000, Flaky("still down"))
    began = time.monotonic()
    with pytest.raises(Flaky, match="still down"):
        call_with_retries(fn, transient=_is_flaky, budget=0.3)
    assert 0.3 <= time.monotonic() - began < 2.0
    assert len(calls) >= 3


def test_a_spent_budget_still_tries_once_more() -> None:
    calls, fn = _failing(1_000_000, Flaky())
    with pytest.raises(Flaky):
        call_with_retries(fn, transient=_is_flaky, budget=0.0)
    assert len(calls) == 2


def test_the_first_try_builds_no_retry_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the module is for: tenacity's state costs CPU that a call that succeeds at
    once (nearly every call) should not pay."""
    import tenacity

    def no_retry_state(*args: object, **kwargs: object) -> None:
        raise AssertionError("retry state built for a call that needed none")

    monkeypatch.setattr(tenacity, "Retrying", no_retry_state)
    calls, fn = _failing(0, Flaky())
    assert call_with_retries(fn, transient=_is_flaky, budget=5.0) == "answer"
    assert len(calls) == 1
