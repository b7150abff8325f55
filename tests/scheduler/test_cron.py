"""Cron triggers: parsing and errors, Quartz/Unix dialects against croniter on fixed UTC
clocks, time zones, and DST behaviour against a brute-force oracle. No sleeps: every
clock here is a fixed timestamp.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone, tzinfo
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler import cron as cron_module
from scheduler.cron import CronSchedule, parse_time_zone

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def at(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    zone: tzinfo = UTC,
    fold: int = 0,
) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=zone, fold=fold).timestamp()


def fires(schedule: CronSchedule, after: float, count: int) -> list[float]:
    out: list[float] = []
    t: float | None = after
    for _ in range(count):
        assert t is not None
        t = schedule.next_fire(t)
        if t is None:
            break
        out.append(t)
    return out


def fires_until(schedule: CronSchedule, after: float, until: float) -> list[float]:
    out: list[float] = []
    t = schedule.next_fire(after)
    while t is not None and t <= until:
        out.append(t)
        t = schedule.next_fire(t)
    return out


def walls(times: list[float], zone: tzinfo) -> list[str]:
    return [datetime.fromtimestamp(t, zone).isoformat() for t in times]


# -- parsing and errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 0 25 * * ?", "cron '0 0 25 * * ?': hour 25 out of range 0-23"),
        ("x", "cron 'x': expected 5 fields (Unix) or 6-7 (Quartz), got 1"),
        ("", "expected 5 fields (Unix) or 6-7 (Quartz), got 0"),
        ("* * * * * * * *", "got 8"),
        ("60 * * * * ?", "second 60 out of range 0-59"),
        ("0 60 * * * ?", "minute 60 out of range 0-59"),
        ("0 0 0 32 * ?", "day-of-month 32 out of range 1-31"),
        ("0 0 0 0 * ?", "day-of-month 0 out of range 1-31"),
        ("0 0 0 * 13 ?", "month 13 out of range 1-12"),
        ("0 0 0 ? * 0", "day-of-week 0 out of range 1-7 (Quartz: 1=SUN..7=SAT)"),
        ("0 0 0 ? * 8", "day-of-week 8 out of range 1-7"),
        ("0 0 * * 8", "day-of-week 8 out of range 0-7 (Unix: 0 or 7=SUN..6=SAT)"),
        ("0 0 0 ? * FOO", "day-of-week 'FOO' is not a number or name"),
        ("0 0 0 * FOO ?", "month 'FOO' is not a number or name"),
        ("0 x 0 * * ?", "minute 'x' is not a number"),
        ("0 -5 0 * * ?", "minute '-5' is not a number"),
        ("0 5- 0 * * ?", "minute range '5-' has no end"),
        ("0 */0 * * * ?", "minute step 0 in '*/0' out of range 1-60"),
        ("0 */61 * * * ?", "minute step 61"),
        ("0 */x * * * ?", "minute step 'x' in '*/x' is not a number"),
        ("0 0 0 1,,2 * ?", "day-of-month '1,,2' has an empty list entry"),
        ("? * * * * ?", "second '?': '?' is only allowed in day-of-month or day-of-week"),
        ("0 0 0 * ? * 2030", "month '?'"),
        ("0 0 0 * * ? ?", "year '?'"),
        ("0 0 0 1? * ?", "day-of-month '1?': '?' must stand alone"),
        ("0 0 12 1 * MON", "day-of-month '1' and day-of-week 'MON' are both set; Quartz needs '?'"),
        ("0 0 0 LW * ?", "'LW' (last weekday of the month) is not supported"),
        ("0 0 0 L-3 * ?", "'L-3' (offset from the last day) is not supported"),
        ("0 0 0 15W,16 * ?", "'W' needs a single day"),
        ("0 0 0 1-5W * ?", "'W' needs a single day"),
        ("0 0 0 32W * ?", "day-of-month 32 out of range"),
        ("0 0 0 ? * 6#6", "day-of-week '6#6': occurrence '6' out of range 1-5"),
        ("0 0 0 ? * 6#0", "occurrence '0' out of range 1-5"),
        ("0 0 0 ? * 9#2", "day-of-week 9 out of range"),
        ("0 0 * * L", "day-of-week 'L' needs a day"),
        ("0 0 0 30 2 ?", "never fires"),
        ("0 0 0 31 4,6,9,11 ?", "never fires"),
        ("0 0 0 * * ? 2100", "year 2100 out of range 1970-2099"),
        ("0 0 0 * * ? 2030-2020", "year range '2030-2020' goes backwards"),
        ("0 0 0 29 2 ? 2023", "never fires"),
        ("0\u00a00 * * *", "expected 5 fields"),
    ],
)
def test_bad_expressions_name_cron_and_the_problem(expression: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        CronSchedule.parse(expression, "UTC")
    assert str(caught.value).startswith(f"cron {expression!r}: ")
    assert message in str(caught.value)


@pytest.mark.parametrize("value", [None, 5, b"* * * * *", ["* * * * *"]])
def test_non_string_expression_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError, match=r"^cron .*must be a str"):
        CronSchedule.parse(value)  # type: ignore[arg-type]


def test_errors_are_plain_value_errors() -> None:
    # shapes croniter rejects with its own exception types
    for expression in ("0 0 0 ? * 1#x", "@nonsense", "* * * * * * * * *", "0 0 0 ? * MON-#2"):
        with pytest.raises(ValueError) as caught:
            CronSchedule.parse(expression)
        assert type(caught.value) is ValueError
        assert str(caught.value).startswith("cron ")


def test_value_semantics_and_properties() -> None:
    a = CronSchedule.parse("0 0 12 * * ?", "Asia/Shanghai")
    b = CronSchedule.parse("0 0 12 * * ?", "Asia/Shanghai")
    assert a == b and hash(a) == hash(b)
    assert a != CronSchedule.parse("0 0 12 * * ?", "UTC")
    assert a.expression == "0 0 12 * * ?"
    assert a.time_zone == "Asia/Shanghai"
    assert a.zone == ZoneInfo("Asia/Shanghai")
    with pytest.raises(AttributeError):
        a.expression = "x"  # type: ignore[misc]
    assert "Asia/Shanghai" in repr(a)


def test_next_fire_is_strictly_after() -> None:
    schedule = CronSchedule.parse("0 0 12 * * ?", "UTC")
    noon = at(2024, 5, 1, 12)
    assert schedule.next_fire(noon - 0.001) == noon
    assert schedule.next_fire(noon) == noon + 86400
    assert schedule.next_fire(noon + 0.5) == noon + 86400
    every = CronSchedule.parse("* * * * * ?", "UTC")
    assert every.next_fire(noon) == noon + 1
    assert every.next_fire(noon + 0.999) == noon + 1
    assert every.next_fire(noon - 0.5) == noon


def test_the_answer_shared_by_jobs_of_one_expression_follows_the_second_asked() -> None:
    """Parsed schedules are shared and remember their last answer (1,000 jobs of one
    expression firing together ask for the same second): a different second, or a
    fraction of one, must still get its own answer, in any order of asking."""
    schedule = CronSchedule.parse("*/10 * * * * ?", "Europe/Berlin")
    assert CronSchedule.parse("*/10 * * * * ?", "Europe/Berlin") is schedule
    base = datetime(2026, 10, 25, 2, 59, 55, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()  # DST ends
    asked = [base, base + 0.9, base + 5, base + 4.2, base, base + 3600, base + 0.1]
    answers = [schedule.next_fire(t) for t in asked]
    expected = [dataclasses.replace(schedule, _last=[]).next_fire(t) for t in asked]
    assert answers == expected
    assert answers[0] == answers[1] == answers[4] == answers[6] == base + 5
    assert answers[2] == base + 15 and answers[3] == base + 5


@pytest.mark.parametrize("after", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_after_is_rejected(after: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        CronSchedule.parse("* * * * *", "UTC").next_fire(after)


def test_no_future_fire_is_none() -> None:
    past = CronSchedule.parse("0 0 12 * * ? 2020", "UTC")
    assert past.next_fire(at(2024, 1, 1)) is None
    assert past.next_fire(at(2020, 12, 31, 11)) == at(2020, 12, 31, 12)
    assert past.next_fire(at(2020, 12, 31, 12)) is None
    assert CronSchedule.parse("* * * * *", "UTC").next_fire(at(9998, 6, 1)) is None


# -- dialects ---------------------------------------------------------------------------------
def test_quartz_day_of_week_numbering_is_translated() -> None:
    monday_noon = CronSchedule.parse("0 0 12 ? * 2", "UTC")
    start = at(2024, 1, 3)  # a Wednesday
    got = fires(monday_noon, start, 3)
    assert walls(got, UTC) == [
        "2024-01-08T12:00:00+00:00",
        "2024-01-15T12:00:00+00:00",
        "2024-01-22T12:00:00+00:00",
    ]
    assert got == fires(CronSchedule.parse("0 0 12 ? * MON", "UTC"), start, 3)
    assert got == fires(CronSchedule.parse("0 12 * * 1", "UTC"), start, 3)
    assert got == fires(CronSchedule.parse("0 12 * * mon", "UTC"), start, 3)
    sunday = [
        datetime.fromtimestamp(t, UTC).weekday()
        for t in fires(CronSchedule.parse("0 0 0 ? * 1", "UTC"), start, 3)
    ]
    assert sunday == [6, 6, 6]
    saturday = [
        datetime.fromtimestamp(t, UTC).weekday()
        for t in fires(CronSchedule.parse("0 0 0 ? * 7", "UTC"), start, 3)
    ]
    assert saturday == [5, 5, 5]
    # Unix: 0 and 7 are both Sunday
    assert (
        fires(CronSchedule.parse("0 0 * * 0", "UTC"), start, 3)
        == fires(CronSchedule.parse("0 0 * * 7", "UTC"), start, 3)
        == fires(CronSchedule.parse("0 0 0 ? * SUN", "UTC"), start, 3)
    )
    # Quartz MON-FRI = 2-6
    weekdays = fires(CronSchedule.parse("0 0 9 ? * 2-6", "UTC"), start, 10)
    assert {datetime.fromtimestamp(t, UTC).weekday() for t in weekdays} == {0, 1, 2, 3, 4}
    assert weekdays == fires(CronSchedule.parse("0 0 9 ? * MON-FRI", "UTC"), start, 10)
    assert weekdays == fires(CronSchedule.parse("0 9 * * 1-5", "UTC"), start, 10)


def test_question_mark_is_no_restriction() -> None:
    start = at(2024, 2, 27, 13)
    assert (
        fires(CronSchedule.parse("0 0 12 ? * *", "UTC"), start, 5)
        == fires(CronSchedule.parse("0 0 12 * * ?", "UTC"), start, 5)
        == fires(CronSchedule.parse("0 0 12 * * *", "UTC"), start, 5)
        == fires(CronSchedule.parse("0 12 * * *", "UTC"), start, 5)
    )


def test_seven_fields_with_year() -> None:
    schedule = CronSchedule.parse("0 0 12 1 1 ? 2030,2032-2033", "UTC")
    assert walls(fires(schedule, at(2024, 1, 1), 5), UTC) == [
        "2030-01-01T12:00:00+00:00",
        "2032-01-01T12:00:00+00:00",
        "2033-01-01T12:00:00+00:00",
    ]
    assert fires(CronSchedule.parse("0 0 12 1 1 ? *", "UTC"), at(2024, 1, 1), 2) == fires(
        CronSchedule.parse("0 0 12 1 1 ?", "UTC"), at(2024, 1, 1), 2
    )
    every_other = CronSchedule.parse("0 0 0 1 1 ? 2024/2", "UTC")
    assert walls(fires(every_other, at(2023, 6, 1), 3), UTC) == [
        "2024-01-01T00:00:00+00:00",
        "2026-01-01T00:00:00+00:00",
        "2028-01-01T00:00:00+00:00",
    ]


def test_unix_aliases() -> None:
    start = at(2024, 5, 17, 10, 30)
    assert fires(CronSchedule.parse("@hourly", "UTC"), start, 3) == fires(
        CronSchedule.parse("0 * * * *", "UTC"), start, 3
    )
    assert fires(CronSchedule.parse("@daily", "UTC"), start, 1) == [at(2024, 5, 18)]
    assert fires(CronSchedule.parse("@weekly", "UTC"), start, 1) == [at(2024, 5, 19)]
    assert fires(CronSchedule.parse("@monthly", "UTC"), start, 1) == [at(2024, 6, 1)]
    assert fires(CronSchedule.parse("@yearly", "UTC"), start, 1) == [at(2025, 1, 1)]


def test_quartz_special_days() -> None:
    start = at(2024, 1, 1)
    assert walls(fires(CronSchedule.parse("0 0 12 L * ?", "UTC"), start, 3), UTC) == [
        "2024-01-31T12:00:00+00:00",
        "2024-02-29T12:00:00+00:00",
        "2024-03-31T12:00:00+00:00",
    ]
    # third Friday (Quartz 6 = FRI)
    assert walls(fires(CronSchedule.parse("0 0 12 ? * 6#3", "UTC"), start, 3), UTC) == [
        "2024-01-19T12:00:00+00:00",
        "2024-02-16T12:00:00+00:00",
        "2024-03-15T12:00:00+00:00",
    ]
    assert fires(CronSchedule.parse("0 0 12 ? * FRI#3", "UTC"), start, 3) == fires(
        CronSchedule.parse("0 12 * * 5#3", "UTC"), start, 3
    )
    # last Friday
    assert walls(fires(CronSchedule.parse("0 0 12 ? * 6L", "UTC"), start, 3), UTC) == [
        "2024-01-26T12:00:00+00:00",
        "2024-02-23T12:00:00+00:00",
        "2024-03-29T12:00:00+00:00",
    ]
    assert fires(CronSchedule.parse("0 12 * * 5L", "UTC"), start, 3) == fires(
        CronSchedule.parse("0 0 12 ? * FRIL", "UTC"), start, 3
    )
    # Quartz: 'L' alone in day-of-week is Saturday
    assert fires(CronSchedule.parse("0 0 12 ? * L", "UTC"), start, 3) == fires(
        CronSchedule.parse("0 0 12 ? * SAT", "UTC"), start, 3
    )
    # 15W: 2024-06-15 is a Saturday -> Friday 14th; 2024-09-15 a Sunday -> Monday 16th
    w = CronSchedule.parse("0 0 12 15W * ?", "UTC")
    assert w.next_fire(at(2024, 6, 1)) == at(2024, 6, 14, 12)
    assert w.next_fire(at(2024, 9, 1)) == at(2024, 9, 16, 12)
    # 1W on a Saturday does not leave the month: Monday the 3rd (2024-06-01 is a Saturday)
    assert CronSchedule.parse("0 0 12 1W * ?", "UTC").next_fire(at(2024, 5, 31)) == at(2024, 6, 3, 12)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("0 0 12 L * ?", "0 0 12 L * *"),
        ("0 0 12 15W * ?", "0 0 12 15W * *"),
        ("0 0 12 1W * ?", "0 0 12 1W * *"),
        ("0 0 12 31W * ?", "0 0 12 31W * *"),
        ("0 0 12 ? * 6#3", "0 0 12 * * 5#3"),
        ("0 0 12 ? * 2#5", "0 0 12 * * 1#5"),
        ("0 0 12 ? * 6L", "0 0 12 * * L5"),
        ("30 15 8 ? JAN-MAR MON-FRI", "30 15 8 * JAN-MAR MON-FRI"),
        ("0 0 0 1,15,L * ?", "0 0 0 1,15,L * *"),
    ],
)
def test_special_days_agree_with_croniter(ours: str, theirs: str) -> None:
    start = at(2023, 1, 1)
    expected = []
    it = croniter(theirs, start, second_at_beginning=True)
    for _ in range(30):
        expected.append(it.get_next(float))
    assert fires(CronSchedule.parse(ours, "UTC"), start, 30) == expected


def test_unix_day_fields_are_or_when_both_restricted() -> None:
    # Vixie cron and croniter: the 13th, or any Friday
    ours = fires(CronSchedule.parse("0 0 13 * 5", "UTC"), at(2024, 1, 1), 20)
    it = croniter("0 0 13 * 5", at(2024, 1, 1))
    assert ours == [it.get_next(float) for _ in range(20)]


def test_full_day_fields_restrict_nothing() -> None:
    start = at(2024, 1, 1)
    mondays = fires(CronSchedule.parse("0 0 * * 1", "UTC"), start, 6)
    assert fires(CronSchedule.parse("0 0 */1 * 1", "UTC"), start, 6) == mondays
    assert fires(CronSchedule.parse("0 0 1-31 * MON", "UTC"), start, 6) == mondays
    assert fires(CronSchedule.parse("0 0 0 */1 * MON", "UTC"), start, 6) == mondays  # Quartz: no '?' needed
    fifteenth = fires(CronSchedule.parse("0 0 15 * *", "UTC"), start, 6)
    assert fires(CronSchedule.parse("0 0 15 * 0-6", "UTC"), start, 6) == fifteenth
    assert fires(CronSchedule.parse("0 0 15 * SUN-SAT", "UTC"), start, 6) == fifteenth


def test_ranges_wrap_like_quartz() -> None:
    start = at(2024, 1, 1)
    hours = [
        datetime.fromtimestamp(t, UTC).hour
        for t in fires(CronSchedule.parse("0 0 22-2 * * ?", "UTC"), start, 5)
    ]
    assert hours == [1, 2, 22, 23, 0]
    # Quartz carries the step across the wrap: 50, 65 -> 5
    minutes = [
        datetime.fromtimestamp(t, UTC).minute
        for t in fires(CronSchedule.parse("0 50-10/15 * * * ?", "UTC"), start, 4)
    ]
    assert minutes == [5, 50, 5, 50]
    days = {
        datetime.fromtimestamp(t, UTC).weekday()
        for t in fires(CronSchedule.parse("0 0 0 ? * FRI-MON", "UTC"), start, 8)
    }
    assert days == {4, 5, 6, 0}
    assert fires(CronSchedule.parse("0 0 * * FRI-MON", "UTC"), start, 8) == fires(
        CronSchedule.parse("0 0 * * 5-7,1", "UTC"), start, 8
    )
    # an equal range is that one value (croniter would read it as the whole cycle)
    assert fires(CronSchedule.parse("0 5-5 * * * ?", "UTC"), start, 2) == [
        at(2024, 1, 1, 0, 5),
        at(2024, 1, 1, 1, 5),
    ]


def test_start_and_step() -> None:
    start = at(2024, 1, 1)
    minutes = [
        datetime.fromtimestamp(t, UTC).minute
        for t in fires(CronSchedule.parse("0 5/20 * * * ?", "UTC"), start, 4)
    ]
    assert minutes == [5, 25, 45, 5]
    days = [
        datetime.fromtimestamp(t, UTC).day
        for t in fires(CronSchedule.parse("0 0 0 */10 * ?", "UTC"), start, 4)
    ]
    assert days == [11, 21, 31, 1]


# -- property tests against croniter (UTC, fixed clocks) ---------------------------------------
def _field(values: range) -> st.SearchStrategy[str]:
    low, high = values.start, values.stop - 1
    single = st.integers(low, high).map(str)
    ranged = (
        st.tuples(st.integers(low, high), st.integers(low, high))
        .filter(lambda p: p[0] < p[1])
        .map(lambda p: f"{p[0]}-{p[1]}")
    )
    stepped = (
        st.tuples(st.integers(low, high), st.integers(low, high), st.integers(1, high - low))
        .filter(lambda p: p[0] < p[1])
        .map(lambda p: f"{p[0]}-{p[1]}/{p[2]}")
    )
    star_step = st.integers(1, max(1, (high - low) // 2)).map(lambda s: f"*/{s}")
    listed = st.lists(single, min_size=2, max_size=4, unique=True).map(",".join)
    return st.one_of(st.just("*"), single, ranged, stepped, star_step, listed)


SECONDS = _field(range(0, 60))
MINUTES = _field(range(0, 60))
HOURS = _field(range(0, 24))
DAYS = st.one_of(st.just("*"), _field(range(1, 29)))
MONTHS = st.one_of(st.just("*"), _field(range(1, 13)))
CLOCK = st.integers(int(at(2000, 1, 1)), int(at(2040, 1, 1)))


def _croniter_fires(expression: str, start: float, count: int, *, seconds_first: bool) -> list[float]:
    it = croniter(expression, start, second_at_beginning=seconds_first)
    return [it.get_next(float) for _ in range(count)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(second=SECONDS, minute=MINUTES, hour=HOURS, day=DAYS, month=MONTHS, start=CLOCK)
def test_quartz_times_agree_with_croniter(
    second: str, minute: str, hour: str, day: str, month: str, start: int
) -> None:
    ours = f"{second} {minute} {hour} {day} {month} ?"
    theirs = f"{second} {minute} {hour} {day} {month} *"
    expected = _croniter_fires(theirs, start, 5, seconds_first=True)
    assert fires(CronSchedule.parse(ours, "UTC"), start, 5) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    minute=MINUTES,
    hour=HOURS,
    day=DAYS,
    month=MONTHS,
    weekday=st.one_of(st.just("*"), _field(range(0, 7))),
    start=CLOCK,
)
def test_unix_agrees_with_croniter(
    minute: str, hour: str, day: str, month: str, weekday: str, start: int
) -> None:
    expression = f"{minute} {hour} {day} {month} {weekday}"
    expanded, _ = croniter.expand(expression)
    # croniter reads a day field that covers every day as '*' only when the other field
    # contains a '*'; here such a field never restricts (see test_full_day_fields_restrict_nothing)
    assume(not (day != "*" and weekday != "*" and ["*"] in (expanded[2], expanded[4])))
    assume(not (day != "*" and weekday != "*" and (len(expanded[2]) == 31 or len(expanded[4]) == 7)))
    expected = _croniter_fires(expression, start, 5, seconds_first=False)
    assert fires(CronSchedule.parse(expression, "UTC"), start, 5) == expected


@st.composite
def quartz_weekdays(draw: st.DrawFn) -> tuple[str, str]:
    """A Quartz day-of-week field (1=SUN..7=SAT) and the same days in croniter's numbering."""
    days = draw(st.lists(st.integers(1, 7), min_size=1, max_size=3, unique=True))
    if draw(st.booleans()) and len(days) >= 2:
        low, high = sorted(days[:2])
        if low < high:
            return f"{low}-{high}", f"{low - 1}-{high - 1}"
    names = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
    quartz = ",".join(names[d - 1] if draw(st.booleans()) else str(d) for d in days)
    return quartz, ",".join(str(d - 1) for d in days)


@settings(max_examples=100, deadline=None)
@given(
    second=SECONDS,
    minute=MINUTES,
    hour=HOURS,
    weekday=quartz_weekdays(),
    start=CLOCK,
    year=st.one_of(st.none(), st.integers(2000, 2045).map(str)),
)
def test_quartz_weekdays_and_years_agree_with_croniter(
    second: str, minute: str, hour: str, weekday: tuple[str, str], start: int, year: str | None
) -> None:
    quartz_dow, croniter_dow = weekday
    ours = f"{second} {minute} {hour} ? * {quartz_dow}" + (f" {year}" if year else "")
    theirs = f"{second} {minute} {hour} * * {croniter_dow}" + (f" {year}" if year else "")
    schedule = CronSchedule.parse(ours, "UTC")
    got = fires(schedule, start, 5)
    if year is not None and int(year) < datetime.fromtimestamp(start, UTC).year:
        assert got == []
        return
    expected: list[float] = []
    it = croniter(theirs, start, second_at_beginning=True)
    for _ in range(5):
        try:
            expected.append(it.get_next(float))
        except Exception:  # croniter: no next date within its horizon
            break
    assert got == expected


# -- time zones -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["GMT+08:00", "UTC+8", "+08:00", "GMT+8", "GMT+0800", "utc+08:00"])
def test_fixed_offsets_equal_asia_shanghai(name: str) -> None:
    start = at(2024, 3, 1)
    for expression in ("0 0 12 * * ?", "0 */7 * * * ?", "30 15 3 ? * MON-FRI", "0 0 * * *"):
        assert fires(CronSchedule.parse(expression, name), start, 20) == fires(
            CronSchedule.parse(expression, "Asia/Shanghai"), start, 20
        )
    assert CronSchedule.parse("0 0 12 * * ?", name).next_fire(start) == at(2024, 3, 1, 4)


def test_negative_and_half_hour_offsets() -> None:
    schedule = CronSchedule.parse("0 0 12 * * ?", "GMT-05:30")
    assert schedule.next_fire(at(2024, 3, 1)) == at(2024, 3, 1, 17, 30)
    assert schedule.zone.utcoffset(None) == -timedelta(hours=5, minutes=30)
    assert CronSchedule.parse("0 0 12 * * ?", "Asia/Kolkata").next_fire(at(2024, 3, 1)) == CronSchedule.parse(
        "0 0 12 * * ?", "GMT+05:30"
    ).next_fire(at(2024, 3, 1))


@pytest.mark.parametrize("name", ["UTC", "GMT", "Etc/UTC", "utc", "GMT+00:00", "+00:00"])
def test_utc_spellings(name: str) -> None:
    assert CronSchedule.parse("0 0 12 * * ?", name).next_fire(at(2024, 3, 1)) == at(2024, 3, 1, 12)


def test_iana_zone_is_not_confused_with_posix_sign() -> None:
    # IANA's Etc/GMT+8 is UTC-8 (POSIX sign); Java's GMT+8 is UTC+8
    assert CronSchedule.parse("0 0 12 * * ?", "Etc/GMT+8").next_fire(at(2024, 3, 1)) == at(2024, 3, 1, 20)
    assert CronSchedule.parse("0 0 12 * * ?", "GMT+8").next_fire(at(2024, 3, 1)) == at(2024, 3, 1, 4)


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Olympus",
        "",
        "GMT+25:00",
        "GMT+08:75",
        "../../etc/passwd",
        "/etc/localtime",
        "Europe",
        "GMT+",
        "8",
    ],
)
def test_bad_zones_name_time_zone(name: str) -> None:
    with pytest.raises(ValueError, match=r"^time_zone "):
        CronSchedule.parse("* * * * *", name)
    with pytest.raises(ValueError, match=r"^time_zone "):
        parse_time_zone(name)


def test_non_string_zone() -> None:
    with pytest.raises(ValueError, match=r"^time_zone 8: must be a str"):
        CronSchedule.parse("* * * * *", 8)  # type: ignore[arg-type]


def test_local_zone_follows_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    cron_module._local_zone.cache_clear()
    try:
        monkeypatch.setenv("TZ", "Asia/Tokyo")
        assert parse_time_zone(None) == ZoneInfo("Asia/Tokyo")
        monkeypatch.setenv("TZ", ":Europe/Berlin")
        cron_module._local_zone.cache_clear()
        assert parse_time_zone(None) == ZoneInfo("Europe/Berlin")
        monkeypatch.setenv("TZ", "EST5EDT,M3.2.0,M11.1.0")  # a POSIX rule: falls back to the system's zone
        cron_module._local_zone.cache_clear()
        assert isinstance(parse_time_zone(None), tzinfo)
    finally:
        monkeypatch.undo()
        cron_module._local_zone.cache_clear()
    schedule = CronSchedule.parse("0 0 12 * * ?")
    assert schedule.time_zone is None
    noon_local = datetime(2024, 3, 1, 12, tzinfo=schedule.zone).timestamp()
    assert schedule.next_fire(noon_local - 1) == noon_local


# -- DST (fixed clocks) -----------------------------------------------------------------------
def test_berlin_spring_forward_daily_0230_runs_once_at_0300() -> None:
    schedule = CronSchedule.parse("0 30 2 * * ?", "Europe/Berlin")
    got = fires_until(schedule, at(2024, 3, 30, 12, zone=BERLIN), at(2024, 4, 1, 12, zone=BERLIN))
    assert walls(got, BERLIN) == ["2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"]


def test_new_york_spring_forward_daily_0230_runs_once_at_0300() -> None:
    schedule = CronSchedule.parse("30 2 * * *", "America/New_York")
    got = fires_until(schedule, at(2024, 3, 9, 12, zone=NEW_YORK), at(2024, 3, 11, 12, zone=NEW_YORK))
    assert walls(got, NEW_YORK) == ["2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"]


def test_new_york_fall_back_daily_0130_runs_once() -> None:
    schedule = CronSchedule.parse("0 30 1 * * ?", "America/New_York")
    got = fires_until(schedule, at(2024, 11, 2, 12, zone=NEW_YORK), at(2024, 11, 4, 12, zone=NEW_YORK))
    assert walls(got, NEW_YORK) == ["2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]
    # asked from inside the repeated hour (second pass, EST) it does not fire again
    inside = at(2024, 11, 3, 1, 10, zone=NEW_YORK, fold=1)
    assert walls([schedule.next_fire(inside) or 0], NEW_YORK) == ["2024-11-04T01:30:00-05:00"]
    # nor from between the two occurrences
    between = at(2024, 11, 3, 1, 45, zone=NEW_YORK)
    assert schedule.next_fire(between) == at(2024, 11, 4, 1, 30, zone=NEW_YORK)


def test_berlin_fall_back_daily_0230_runs_once() -> None:
    schedule = CronSchedule.parse("0 30 2 * * ?", "Europe/Berlin")
    got = fires_until(schedule, at(2024, 10, 26, 12, zone=BERLIN), at(2024, 10, 28, 12, zone=BERLIN))
    assert walls(got, BERLIN) == ["2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"]


def test_every_minute_of_a_missing_hour_runs_once_after_the_gap() -> None:
    schedule = CronSchedule.parse("0 * 2 * * ?", "Europe/Berlin")
    got = fires_until(schedule, at(2024, 3, 30, 12, zone=BERLIN), at(2024, 4, 1, 0, zone=BERLIN))
    assert walls(got, BERLIN) == ["2024-03-31T03:00:00+02:00"]


@pytest.mark.parametrize("zone", [BERLIN, NEW_YORK], ids=str)
@pytest.mark.parametrize("expression", ["0 0 * * * ?", "0 * * * *"])
def test_hourly_fires_once_per_real_hour_across_both_transitions(zone: ZoneInfo, expression: str) -> None:
    schedule = CronSchedule.parse(expression, str(zone))
    for day in (
        datetime(2024, 3, 30, tzinfo=zone),
        datetime(2024, 10, 26, tzinfo=zone),
        datetime(2024, 3, 9, tzinfo=zone),
        datetime(2024, 11, 2, tzinfo=zone),
    ):
        start = day.timestamp()
        got = fires_until(schedule, start, start + 3 * 86400)
        assert got[0] == start + 3600
        assert all(b - a == 3600 for a, b in pairwise(got)), walls(got, zone)
        assert len(got) == 3 * 24


@pytest.mark.parametrize("zone", [BERLIN, NEW_YORK], ids=str)
@pytest.mark.parametrize(
    ("expression", "period"), [("0 */15 * * * ?", 900), ("0 * * * * ?", 60), ("*/5 * * * *", 300)]
)
def test_sub_hourly_follows_real_time(zone: ZoneInfo, expression: str, period: int) -> None:
    schedule = CronSchedule.parse(expression, str(zone))
    for transition in (
        datetime(2024, 3, 31, tzinfo=UTC),
        datetime(2024, 10, 27, tzinfo=UTC),
        datetime(2024, 3, 10, 5, tzinfo=UTC),
        datetime(2024, 11, 3, 5, tzinfo=UTC),
    ):
        start = transition.timestamp() - 6 * 3600
        got = fires_until(schedule, start, start + 12 * 3600)
        assert all(b - a == period for a, b in pairwise(got))
        assert len(got) == 12 * 3600 // period


def test_every_second_across_transitions() -> None:
    schedule = CronSchedule.parse("* * * * * ?", "Europe/Berlin")
    for transition in (at(2024, 3, 31, 1), at(2024, 10, 27, 1)):
        got = fires_until(schedule, transition - 30, transition + 30)
        assert got == [float(t) for t in range(int(transition) - 29, int(transition) + 31)]


# brute-force oracle: walk real time minute by minute, read the wall clock
def _oracle(expression: str, zone: ZoneInfo, start: int, end: int) -> list[float]:
    expanded, _ = croniter.expand(expression)
    minutes = set(range(60)) if expanded[0] == ["*"] else set(expanded[0])
    hours = set(range(24)) if expanded[1] == ["*"] else set(expanded[1])
    elapsed = len(hours) == 24
    out: set[int] = set()
    previous_wall: datetime | None = None
    for instant in range(start, end + 1, 60):
        local = datetime.fromtimestamp(instant, zone)
        wall = local.replace(tzinfo=None)
        if previous_wall is not None and wall - previous_wall > timedelta(minutes=1) and not elapsed:
            # a gap: wall minutes no instant has; a matching one fires at the first instant after
            missing = previous_wall + timedelta(minutes=1)
            while missing < wall:
                if missing.minute in minutes and missing.hour in hours:
                    out.add(instant)
                missing += timedelta(minutes=1)
        previous_wall = wall
        if local.minute not in minutes or local.hour not in hours:
            continue
        repeated = local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset()
        if repeated and local.fold == 1 and not elapsed:
            continue
        out.add(instant)
    return [float(x) for x in sorted(out)]


TRANSITIONS = [
    ("Europe/Berlin", datetime(2024, 3, 31, 1, tzinfo=UTC)),
    ("Europe/Berlin", datetime(2024, 10, 27, 1, tzinfo=UTC)),
    ("America/New_York", datetime(2024, 3, 10, 7, tzinfo=UTC)),
    ("America/New_York", datetime(2024, 11, 3, 6, tzinfo=UTC)),
    ("Australia/Sydney", datetime(2024, 4, 6, 16, tzinfo=UTC)),
    ("Australia/Sydney", datetime(2024, 10, 5, 16, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2024, 4, 6, 15, tzinfo=UTC)),  # 30-minute DST
    ("Australia/Lord_Howe", datetime(2024, 10, 5, 15, 30, tzinfo=UTC)),
]


@settings(max_examples=120, deadline=None)
@given(
    transition=st.sampled_from(TRANSITIONS),
    minute=st.one_of(
        st.just("*"), st.integers(0, 59).map(str), st.sampled_from(["*/15", "0,30", "10-20", "59"])
    ),
    hour=st.one_of(st.just("*"), st.integers(0, 23).map(str), st.sampled_from(["1-3", "2", "*/2", "0-23"])),
    offset=st.integers(-3 * 3600, 3 * 3600),
)
def test_dst_matches_brute_force_oracle(
    transition: tuple[str, datetime], minute: str, hour: str, offset: int
) -> None:
    name, moment = transition
    zone = ZoneInfo(name)
    expression = f"{minute} {hour} * * *"
    start = int(moment.timestamp()) - 5 * 3600 + offset // 60 * 60
    end = start + 10 * 3600
    schedule = CronSchedule.parse(expression, name)
    # the oracle sees instants start..end; compare fires strictly after start up to end
    expected = [t for t in _oracle(expression, zone, start, end) if t > start]
    assert fires_until(schedule, start, end) == expected


@settings(max_examples=60, deadline=None)
@given(
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago"]),
    hour=st.integers(0, 23),
    minute=st.integers(0, 59),
    year=st.integers(2020, 2030),
)
def test_wall_clock_jobs_run_exactly_once_a_day_all_year(
    zone: str, hour: int, minute: int, year: int
) -> None:
    tz = ZoneInfo(zone)
    schedule = CronSchedule.parse(f"0 {minute} {hour} * * ?", zone)
    start = datetime(year, 1, 1, tzinfo=tz).timestamp()
    end = datetime(year + 1, 1, 1, tzinfo=tz).timestamp()
    got = fires_until(schedule, start - 1, end - 1)
    days = [datetime.fromtimestamp(t, tz).date() for t in got]
    assert len(days) == len(set(days)) == (datetime(year + 1, 1, 1) - datetime(year, 1, 1)).days


# -- concurrency ------------------------------------------------------------------------------
def test_next_fire_is_thread_safe() -> None:
    schedule = CronSchedule.parse("0 0 12 ? * 6L", "Europe/Berlin")
    start = at(2000, 1, 1)

    def run() -> Iterator[float]:
        t: float | None = start
        for _ in range(300):
            assert t is not None
            t = schedule.next_fire(t)
            assert t is not None
            yield t

    expected = list(run())
    results: list[list[float]] = []
    lock = threading.Lock()

    def worker() -> None:
        got = list(run())
        with lock:
            results.append(got)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 8
    assert all(r == expected for r in results)


@pytest.mark.parametrize(
    ("iana", "fixed"), [("Etc/UTC", "UTC"), ("Etc/GMT+5", "GMT-05:00"), ("Etc/GMT-14", "+14:00")]
)
def test_fixed_iana_zones_fire_as_their_offset(iana: str, fixed: str) -> None:
    """The IANA names of zones without transitions take the fixed-offset shortcut; its fire
    times are those of the general zone arithmetic and of the equivalent offset zone."""
    after = 1_700_000_000.0
    for expression in ("0 0 12 * * ?", "0 30 2 * * ?", "*/7 * * * * ?", "0 15 10 ? * 6L"):
        named, offset = CronSchedule.parse(expression, iana), CronSchedule.parse(expression, fixed)
        general = dataclasses.replace(named, _fixed_offset=None)
        assert named._fixed_offset is not None
        moment = after
        for _ in range(5):
            got = named.next_fire(moment)
            assert got == offset.next_fire(moment) == general.next_fire(moment)
            assert got is not None
            moment = got
