"""Cron triggers: Unix (5 fields) and Quartz (6-7 fields, seconds first) expressions
evaluated in a time zone, with defined behaviour across daylight-saving transitions.

``CronSchedule.parse(expression, time_zone)`` validates once; ``next_fire(after)`` is
then a pure function of ``after`` (safe from any thread, no I/O, a few microseconds).

Invariants:
- ``next_fire(after)`` is strictly greater than ``after``, or ``None`` when nothing
  matches any more (a year field in the past).
- A bad expression or zone is a ``ValueError`` naming ``cron`` or ``time_zone`` and what
  is wrong; no exception of a parsing library ever reaches a caller.
- DST, for a zone that has it. Two kinds of expression, told apart by the hour field:

  * *wall-clock* expressions (the hour field names specific hours, e.g. ``0 30 2 * * ?``)
    describe a time of day. A wall time that does not exist (spring-forward gap) fires
    once, at the first instant after the gap; a wall time that occurs twice (fall-back
    repeat) fires once, at its first occurrence. Nothing is skipped, nothing doubled.
  * *elapsed-time* expressions (every hour: the hour field covers all 24 hours, e.g.
    ``0 0 * * * ?``, ``0 */5 * * * ?``) describe a rhythm, and follow real time: the
    repeated hour is a real hour and fires like any other (once per real hour for an
    hourly job, not a one-hour hole), and the wall times inside a gap, which no real
    instant has, do not fire (the hour before and after the gap are one real hour apart).

  This is what users of hourly and minutely jobs expect, and it is the rule Vixie/ISC
  cron documents for "wildcard" versus "fixed-time" jobs across DST changes.

Dialect: 5 fields are Unix (minute first; day-of-week 0-7, 0 and 7 = Sunday; @daily and
friends). 6 or 7 fields are always Quartz, seconds first, optional year 1970-2099,
day-of-week 1-7 = SUN..SAT; ``L``, ``nW``, ``d#n``, ``dL`` as Quartz writes them (``LW``
and ``L-n`` are rejected). Ranges may wrap ('FRI-MON', hours '22-2'). A day field that
admits every day ('*', '?', '*/1', '1-31') restricts nothing; when both day fields
restrict, Unix fires on either (Vixie, POSIX) and Quartz demands '?' in one of them.
An expression that can never fire (Feb 30) is rejected at parse time.

Design notes: croniter is the reference dialect (the tests compare this module against
it on fixed UTC clocks), but it is not used at run time: its ``get_next`` does calendar
arithmetic with relativedelta on every call (an order of magnitude more CPU than the
table walk here, on the path of every fire), an iterator is not thread-safe, its DST
handling is not what is specified above, its messages do not name the field, and a few
of its readings differ from Quartz
('5-5' is the whole cycle there, a wrapping range with a step loses its phase). So the
expression is parsed here into per-field lookup tables and ``next_fire`` walks wall-clock
time with integer arithmetic, handing only the wall-to-instant mapping to ``zoneinfo``
(``fold`` tells the two occurrences of a repeated time apart).
"""

from __future__ import annotations

import calendar
import functools
import math
import os
import re
import time
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone, tzinfo

__all__ = ["CronSchedule", "parse_time_zone"]

_SECOND = timedelta(seconds=1)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
#: years beyond this are never searched (datetime ends at 9999)
_LAST_YEAR = 9998
#: 9998-01-01T00:00:00Z: later instants have no fire (their wall time may pass year 9999)
_LAST_INSTANT = (date(_LAST_YEAR, 1, 1).toordinal() - _EPOCH_ORDINAL) * 86400
_MONTHS = {name.upper(): i for i, name in enumerate(calendar.month_abbr) if name}
_UNIX_DAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
_QUARTZ_DAYS = {name: number + 1 for name, number in _UNIX_DAYS.items()}
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_OFFSET_ZONE = re.compile(
    r"(?:(?P<prefix>GMT|UTC))?(?P<sign>[+-])(?P<hours>\d{1,2})(?::?(?P<minutes>\d{2}))?", re.I
)


# -- time zones -------------------------------------------------------------------------------
def parse_time_zone(name: str | None) -> tzinfo:
    """The zone called ``name``: an IANA name (``Asia/Shanghai``), ``UTC``/``GMT``, or a
    fixed offset as Java and ElasticJob write it (``GMT+08:00``, ``GMT-05:30``, ``UTC+8``,
    ``+08:00``). ``None`` is the machine's local zone. Anything else: ``ValueError``
    naming ``time_zone``."""
    if name is None:
        return _local_zone()
    if not isinstance(name, str):
        raise ValueError(f"time_zone {name!r}: must be a str or None, not {type(name).__name__}")
    return _named_zone(name)


@functools.lru_cache(maxsize=256)
def _named_zone(name: str) -> tzinfo:
    text = name.strip()
    if text.upper() in ("UTC", "GMT", "Z", "UCT"):
        return timezone.utc
    match = _OFFSET_ZONE.fullmatch(text)
    if match:
        hours, minutes = int(match["hours"]), int(match["minutes"] or 0)
        if hours > 23 or minutes > 59:
            raise ValueError(f"time_zone {name!r}: offset out of range (at most 23:59)")
        sign = -1 if match["sign"] == "-" else 1
        offset = sign * timedelta(hours=hours, minutes=minutes)
        label = f"GMT{match['sign']}{hours:02d}:{minutes:02d}"
        return timezone.utc if not offset else timezone(offset, label)
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: keys such as '../x' or absolute paths; OSError: a directory name
        raise ValueError(
            f"time_zone {name!r}: unknown time zone (use an IANA name such as 'Asia/Shanghai', "
            "'UTC', or an offset such as 'GMT+08:00')"
        ) from None


@functools.lru_cache(maxsize=1)
def _local_zone() -> tzinfo:
    """The machine's zone with its DST rules where the system says which it is; a fixed
    offset (today's) only as the last resort (no TZ, no /etc/localtime)."""
    env = os.environ.get("TZ", "").lstrip(":")
    if env:
        try:
            return _named_zone(env)
        except ValueError:
            pass  # a POSIX rule string such as 'EST5EDT,M3.2.0,M11.1.0': try the system file
    localtime = "/etc/localtime"
    target = os.path.realpath(localtime)
    if "/zoneinfo/" in target:
        try:
            return zoneinfo.ZoneInfo(target.rsplit("/zoneinfo/", 1)[1])
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            pass
    try:
        with open(localtime, "rb") as stream:
            return zoneinfo.ZoneInfo.from_file(stream, key="localtime")
    except (OSError, ValueError):
        pass
    return datetime.now().astimezone().tzinfo or timezone.utc


# -- parsing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _FieldSpec:
    label: str
    low: int
    high: int
    #: the largest value of the repeating cycle; above it a value wraps (Unix day-of-week 7)
    cycle_high: int
    names: Mapping[str, int] = field(default_factory=dict)
    hint: str = ""

    @property
    def size(self) -> int:
        return self.cycle_high - self.low + 1


_SECONDS = _FieldSpec("second", 0, 59, 59)
_MINUTES = _FieldSpec("minute", 0, 59, 59)
_HOURS = _FieldSpec("hour", 0, 23, 23)
_DAYS_OF_MONTH = _FieldSpec("day-of-month", 1, 31, 31)
_MONTH = _FieldSpec("month", 1, 12, 12, _MONTHS)
_UNIX_DOW = _FieldSpec("day-of-week", 0, 7, 6, _UNIX_DAYS, " (Unix: 0 or 7=SUN..6=SAT)")
_QUARTZ_DOW = _FieldSpec("day-of-week", 1, 7, 7, _QUARTZ_DAYS, " (Quartz: 1=SUN..7=SAT)")
_YEAR = _FieldSpec("year", 1970, 2099, 2099)


@dataclass(frozen=True)
class _Fields:
    """A parsed expression. Weekdays are numbered 0=Sunday..6=Saturday whatever the dialect."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    #: None: any year
    years: frozenset[int] | None
    #: day-of-month and day-of-week written as '*' or '?': no restriction from that field
    dom_any: bool
    dow_any: bool
    dom_days: frozenset[int]
    dom_last: bool
    dom_nearest_weekday: frozenset[int]
    dow_days: frozenset[int]
    #: (weekday, n): the n-th such weekday of the month ('6#3')
    dow_nth: frozenset[tuple[int, int]]
    #: weekdays whose last occurrence in the month matches ('5L')
    dow_last: frozenset[int]


class _Parser:
    """One expression's parse; every error names the expression and the field."""

    def __init__(self, expression: str) -> None:
        self.expression = expression

    def error(self, problem: str) -> ValueError:
        return ValueError(f"cron {self.expression!r}: {problem}")

    def parse(self) -> _Fields:
        text = self.expression.strip()
        text = _ALIASES.get(text.lower(), text)
        # ASCII whitespace only: cron does not split on no-break or ideographic spaces
        parts = re.split(r"[ \t\n\r\f\v]+", text) if text else []
        if len(parts) == 5:
            second, (minute, hour, dom, month, dow), year = "0", parts, None
            dow_spec, quartz = _UNIX_DOW, False
        elif len(parts) in (6, 7):
            second, minute, hour, dom, month, dow = parts[:6]
            year = parts[6] if len(parts) == 7 else None
            dow_spec, quartz = _QUARTZ_DOW, True
        else:
            raise self.error(f"expected 5 fields (Unix) or 6-7 (Quartz), got {len(parts)}")
        for spec, value in ((_SECONDS, second), (_MINUTES, minute), (_HOURS, hour), (_MONTH, month)):
            if "?" in value:
                raise self.error(
                    f"{spec.label} {value!r}: '?' is only allowed in day-of-month or day-of-week"
                )
        if year is not None and "?" in year:
            raise self.error(f"year {year!r}: '?' is only allowed in day-of-month or day-of-week")
        dom_any, dom_days, dom_last, nearest = self.day_of_month(dom)
        dow_any, dow_days, dow_nth, dow_last = self.day_of_week(dow, dow_spec, quartz)
        # a day field that admits every day restricts nothing ('*/1', '1-31', 'SUN-SAT'):
        # only restricting fields take part in the Unix either-field rule below
        dom_any = dom_any or len(dom_days) == 31
        dow_any = dow_any or len(dow_days) == 7
        if quartz and not dom_any and not dow_any:
            raise self.error(
                f"day-of-month {dom!r} and day-of-week {dow!r} are both set; Quartz needs '?' in one of them"
            )
        return _Fields(
            seconds=frozenset(self.values(second, _SECONDS)),
            minutes=frozenset(self.values(minute, _MINUTES)),
            hours=frozenset(self.values(hour, _HOURS)),
            months=frozenset(self.values(month, _MONTH)),
            years=None if year is None or year == "*" else frozenset(self.values(year, _YEAR)),
            dom_any=dom_any,
            dow_any=dow_any,
            dom_days=frozenset(dom_days),
            dom_last=dom_last,
            dom_nearest_weekday=frozenset(nearest),
            dow_days=frozenset(dow_days),
            dow_nth=frozenset(dow_nth),
            dow_last=frozenset(dow_last),
        )

    # -- generic fields ------------------------------------------------------------------
    def values(self, text: str, spec: _FieldSpec) -> set[int]:
        result: set[int] = set()
        for token in self.tokens(text, spec):
            result |= self.token(token, spec)
        return result

    def tokens(self, text: str, spec: _FieldSpec) -> list[str]:
        tokens = text.split(",")
        if any(not token for token in tokens):
            raise self.error(f"{spec.label} {text!r} has an empty list entry")
        return tokens

    def number(self, text: str, spec: _FieldSpec) -> int:
        if text.isascii() and text.isdigit():
            value = int(text)
        elif spec.names and text.upper() in spec.names:
            value = spec.names[text.upper()]
        else:
            kind = "a number or name" if spec.names else "a number"
            raise self.error(f"{spec.label} {text!r} is not {kind}{spec.hint}")
        if not spec.low <= value <= spec.high:
            raise self.error(f"{spec.label} {value} out of range {spec.low}-{spec.high}{spec.hint}")
        return value

    def token(self, token: str, spec: _FieldSpec) -> set[int]:
        base, slash, step_text = token.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()):
                raise self.error(f"{spec.label} step {step_text!r} in {token!r} is not a number")
            step = int(step_text)
            if not 1 <= step <= spec.size:
                raise self.error(f"{spec.label} step {step} in {token!r} out of range 1-{spec.size}")
        if base == "*":
            low, high = spec.low, spec.cycle_high
        elif "-" in base[1:]:
            first, _, last = base.partition("-")
            if not last:
                raise self.error(f"{spec.label} range {token!r} has no end")
            low, high = self.number(first, spec), self.number(last, spec)
            if high < low and spec is _YEAR:
                raise self.error(f"year range {token!r} goes backwards")
        else:
            low = self.number(base, spec)
            # Quartz 'start/step': from start to the end of the field
            high = max(spec.cycle_high, low) if slash else low
        if low <= high:
            span: Iterable[int] = range(low, high + 1, step)
        else:
            # a range that wraps ('FRI-MON', hours '22-2'): Quartz carries the step across
            span = range(low, high + spec.size + 1, step)
        return {value - spec.size if value > spec.cycle_high else value for value in span}

    # -- days ------------------------------------------------------------------------------
    def day_of_month(self, text: str) -> tuple[bool, set[int], bool, set[int]]:
        if text in ("*", "?"):
            return True, set(), False, set()
        if "?" in text:
            raise self.error(f"day-of-month {text!r}: '?' must stand alone")
        days: set[int] = set()
        last = False
        nearest: set[int] = set()
        tokens = self.tokens(text, _DAYS_OF_MONTH)
        for token in tokens:
            upper = token.upper()
            if upper == "L":
                last = True
            elif upper == "LW":
                raise self.error("day-of-month 'LW' (last weekday of the month) is not supported")
            elif upper.startswith("L"):
                raise self.error(f"day-of-month {token!r} (offset from the last day) is not supported")
            elif upper.endswith("W"):
                if len(tokens) > 1 or not (upper[:-1].isascii() and upper[:-1].isdigit()):
                    raise self.error(f"day-of-month {text!r}: 'W' needs a single day, e.g. '15W'")
                nearest.add(self.number(upper[:-1], _DAYS_OF_MONTH))
            else:
                days |= self.token(token, _DAYS_OF_MONTH)
        return False, days, last, nearest

    def day_of_week(
        self, text: str, spec: _FieldSpec, quartz: bool
    ) -> tuple[bool, set[int], set[tuple[int, int]], set[int]]:
        if text in ("*", "?"):
            return True, set(), set(), set()
        if "?" in text:
            raise self.error(f"day-of-week {text!r}: '?' must stand alone")
        # the parsed numbering (Quartz 1=SUN, Unix 0/7=SUN) becomes 0=SUN..6=SAT
        internal: Callable[[int], int] = (lambda v: v - 1) if quartz else (lambda v: v % 7)
        days: set[int] = set()
        nth: set[tuple[int, int]] = set()
        last: set[int] = set()
        for token in self.tokens(text, spec):
            upper = token.upper()
            if "#" in upper:
                day_text, _, count_text = upper.partition("#")
                day = internal(self.number(day_text, spec))
                if not (count_text.isascii() and count_text.isdigit() and 1 <= int(count_text) <= 5):
                    raise self.error(f"day-of-week {token!r}: occurrence {count_text!r} out of range 1-5")
                nth.add((day, int(count_text)))
            elif upper == "L":
                if not quartz:
                    raise self.error("day-of-week 'L' needs a day, e.g. '5L' (last Friday)")
                days.add(6)  # Quartz: 'L' alone is the last day of the week, Saturday
            elif upper.endswith("L"):
                last.add(internal(self.number(upper[:-1], spec)))
            else:
                days |= {internal(v) for v in self.token(token, spec)}
        return False, days, nth, last


# -- evaluation -------------------------------------------------------------------------------
def _next_table(values: frozenset[int], size: int, none: int) -> tuple[int, ...]:
    """``table[i]``: the smallest value >= i, or ``none``; one entry past the end."""
    table = [none] * (size + 1)
    following = none
    for i in range(size - 1, -1, -1):
        if i in values:
            following = i
        table[i] = following
    return tuple(table)


class _Plan:
    """Lookup tables for one expression; finds the next matching wall-clock second.

    Thread safety: the only mutable state is the per-month day cache, whose entries are
    pure functions of (year, month); concurrent fills write the same value."""

    _CACHE_LIMIT = 512

    def __init__(self, fields: _Fields) -> None:
        self.fields = fields
        self.next_second = _next_table(fields.seconds, 60, -1)
        self.next_minute = _next_table(fields.minutes, 60, -1)
        self.next_hour = _next_table(fields.hours, 24, -1)
        self.next_month = _next_table(fields.months, 13, 0)
        self.years = None if fields.years is None else tuple(sorted(fields.years))
        self.last_year = _LAST_YEAR if self.years is None else self.years[-1]
        #: every hour matches: the expression is a rhythm, not a time of day (see module doc)
        self.elapsed = len(fields.hours) == 24
        self._day_tables: dict[int, tuple[int, ...]] = {}

    def month_days(self, year: int, month: int) -> set[int]:
        f = self.fields
        first_weekday, last = calendar.monthrange(year, month)
        first = (first_weekday + 1) % 7  # Monday=0 -> Sunday=0
        if f.dom_any and f.dow_any:
            return set(range(1, last + 1))
        by_month: set[int] = set()
        if not f.dom_any:
            by_month = {d for d in f.dom_days if d <= last}
            if f.dom_last:
                by_month.add(last)
            by_month |= {_nearest_weekday(year, month, d, last) for d in f.dom_nearest_weekday}
        by_week: set[int] = set()
        if not f.dow_any:
            by_week = {d for d in range(1, last + 1) if (first + d - 1) % 7 in f.dow_days}
            for weekday, count in f.dow_nth:
                day = 1 + (weekday - first) % 7 + 7 * (count - 1)
                if day <= last:
                    by_week.add(day)
            for weekday in f.dow_last:
                day = 1 + (weekday - first) % 7
                by_week.add(day + 7 * ((last - day) // 7))
        if f.dom_any:
            return by_week
        if f.dow_any:
            return by_month
        return by_month | by_week  # Unix (Vixie, POSIX): both fields restrict, either matches

    def day_table(self, year: int, month: int) -> tuple[int, ...]:
        key = year * 16 + month
        table = self._day_tables.get(key)
        if table is None:
            table = _next_table(frozenset(self.month_days(year, month)), 32, 0)
            if len(self._day_tables) >= self._CACHE_LIMIT:
                self._day_tables.clear()
            self._day_tables[key] = table
        return table

    def ever_matches(self) -> bool:
        # 28 years hold every combination of leap year and weekday of January 1st (1901-2099)
        years = self.years if self.years is not None else range(2000, 2028)
        return any(self.month_days(y, m) for y in years for m in sorted(self.fields.months))

    def next_wall(self, wall: int) -> tuple[int, int, int, int, int, int, int] | None:
        """The first matching wall-clock second >= ``wall`` (seconds since 1970 as if
        UTC), as ``(wall, year, month, day, hour, minute, second)``; None if none."""
        tm = time.gmtime(wall)
        y, mo, d, h, mi, s = tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec
        next_month, next_hour, next_minute, next_second = (
            self.next_month,
            self.next_hour,
            self.next_minute,
            self.next_second,
        )
        years = self.years
        while True:
            if y > self.last_year:
                return None
            if years is not None and y not in years:
                later = [v for v in years if v > y]
                if not later:
                    return None
                y, mo, d, h, mi, s = later[0], 1, 1, 0, 0, 0
            month = next_month[mo]
            if month != mo:
                if not month:
                    y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                    continue
                mo, d, h, mi, s = month, 1, 0, 0, 0
            day = self.day_table(y, mo)[d]
            if day != d:
                if not day:
                    y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
                    d, h, mi, s = 1, 0, 0, 0
                    continue
                d, h, mi, s = day, 0, 0, 0
            hour = next_hour[h]
            if hour != h:
                if hour < 0:
                    d, h, mi, s = d + 1, 0, 0, 0
                    continue
                h, mi, s = hour, 0, 0
            minute = next_minute[mi]
            if minute != mi:
                if minute < 0:
                    h, mi, s = h + 1, 0, 0
                    continue
                mi, s = minute, 0
            second = next_second[s]
            if second != s:
                if second < 0:
                    mi, s = mi + 1, 0
                    continue
                s = second
            days = date(y, mo, d).toordinal() - _EPOCH_ORDINAL
            return days * 86400 + h * 3600 + mi * 60 + s, y, mo, d, h, mi, s


def _nearest_weekday(year: int, month: int, day: int, last: int) -> int:
    """Quartz 'W': the weekday nearest ``day`` without leaving the month (croniter's rule
    for a day past the month's end: the last day stands in)."""
    day = min(day, last)
    weekday = calendar.weekday(year, month, day)
    if weekday == 5:  # Saturday
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday
        return day + 1 if day < last else day - 2
    return day


# -- the schedule -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CronSchedule:
    """A validated cron expression in a zone. Build with :meth:`parse`."""

    expression: str
    time_zone: str | None
    _plan: _Plan = field(repr=False, compare=False)
    _zone: tzinfo = field(repr=False, compare=False)
    #: seconds east of UTC for a zone without transitions, else None
    _fixed_offset: int | None = field(repr=False, compare=False)
    #: the last answer, ``[(whole second, next fire)]``: parsed schedules are shared (an
    #: lru cache), and jobs with one expression fire together, so all but the first of
    #: them ask for the same second (one tuple swap: thread-safe without a lock)
    _last: list[tuple[int, float | None]] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def parse(cls, expression: str, time_zone: str | None = None) -> CronSchedule:
        """Validate ``expression`` (5 fields Unix, 6-7 Quartz) and ``time_zone``;
        ``ValueError`` naming ``cron`` or ``time_zone`` otherwise."""
        if not isinstance(expression, str):
            raise ValueError(f"cron {expression!r}: must be a str, not {type(expression).__name__}")
        if time_zone is not None and not isinstance(time_zone, str):
            raise ValueError(
                f"time_zone {time_zone!r}: must be a str or None, not {type(time_zone).__name__}"
            )
        return _parse_cached(expression, time_zone)

    @property
    def zone(self) -> tzinfo:
        """The zone the expression is read in (the machine's when ``time_zone`` is None)."""
        return self._zone

    @property
    def follows_elapsed_time(self) -> bool:
        """Whether DST repeats and gaps are treated as real time (every-hour expressions)
        rather than as a time of day; see the module docstring."""
        return self._plan.elapsed

    def next_fire(self, after: float) -> float | None:
        """The first fire time strictly after ``after`` (UNIX seconds), or None if the
        expression has no fire after it."""
        if not math.isfinite(after):
            raise ValueError(f"after must be a finite timestamp, got {after!r}")
        if after >= _LAST_INSTANT:
            return None
        base = math.floor(after)
        last = self._last[0] if self._last else None
        if last is not None and last[0] == base:
            return last[1]
        if self._fixed_offset is not None:
            found = self._plan.next_wall(base + self._fixed_offset + 1)
            answer = None if found is None else float(found[0] - self._fixed_offset)
        else:
            answer = self._next_zoned(after, base)
        self._last[:] = [(base, answer)]
        return answer

    def _offset(self, instant: int) -> int:
        offset = datetime.fromtimestamp(instant, self._zone).utcoffset()
        return 0 if offset is None else offset // _SECOND

    def _transition(self, before: int, after: int) -> int:
        """The first instant in (before, after] whose UTC offset differs from ``before``'s
        (zone transitions fall on whole seconds); ``after``'s must differ."""
        offset = self._offset(before)
        while after - before > 1:
            middle = (before + after) // 2
            if self._offset(middle) == offset:
                before = middle
            else:
                after = middle
        return after

    def _next_zoned(self, after: float, base: int) -> float | None:
        zone, plan = self._zone, self._plan
        local = datetime.fromtimestamp(base, zone)
        offset = _seconds(local.utcoffset())
        start = base + offset + 1
        second_pass: int | None = None
        other = _seconds(local.replace(fold=1 - local.fold).utcoffset())
        if other != offset:
            # ``after`` lies in a repeated hour (fall-back), R_s..R_e in wall time
            if local.fold == 0:
                if plan.elapsed:
                    # first pass; the second pass (new offset ``other``) may fire before
                    # the first match after the repeat ends
                    delta = offset - other
                    repeat_start = self._transition(base, base + delta) + other
                    found = plan.next_wall(repeat_start)
                    if found is not None and found[0] < repeat_start + delta:
                        second_pass = found[0] - other
            elif not plan.elapsed:
                # second pass of a wall-clock expression: everything until the repeat
                # ends already fired in the first pass
                delta = other - offset
                start = max(start, self._transition(base - delta, base) + other)
        while True:
            found = plan.next_wall(start)
            if found is None:
                return None if second_pass is None else float(second_pass)
            wall = found[0]
            moment = datetime(found[1], found[2], found[3], found[4], found[5], found[6], tzinfo=zone)
            offset0 = _seconds(moment.utcoffset())
            offset1 = _seconds(moment.replace(fold=1).utcoffset())
            if offset0 == offset1:
                instant = wall - offset0
            elif offset0 > offset1:  # a repeated wall time: fold 0 is the first occurrence
                instant = wall - offset0
                if instant <= after:
                    if not plan.elapsed:
                        start = wall + 1
                        continue
                    instant = wall - offset1
            else:  # a wall time inside a spring-forward gap
                gap_end = self._transition(wall - offset1, wall - offset0)
                if plan.elapsed:
                    start = gap_end + offset1
                    continue
                instant = gap_end
            if second_pass is not None and second_pass < instant:
                instant = second_pass
            return float(instant)


def _seconds(offset: timedelta | None) -> int:
    return 0 if offset is None else offset // _SECOND


@functools.lru_cache(maxsize=1024)
def _parse_cached(expression: str, time_zone: str | None) -> CronSchedule:
    plan = _Plan(_Parser(expression).parse())
    if not plan.ever_matches():
        raise ValueError(f"cron {expression!r}: never fires (no day matches its day and month fields)")
    zone = parse_time_zone(time_zone)
    return CronSchedule(expression, time_zone, plan, zone, _fixed_offset_of(zone))


#: IANA names of zones that never change offset (tzdata's backward links to Etc/UTC and
#: the Etc/GMT±N family); the machine's zone is usually one of them, and it skips the
#: per-fire zone arithmetic
_FIXED_ZONE_NAMES = frozenset(
    {"UTC", "UCT", "GMT", "Universal", "Zulu", "Greenwich", "GMT0", "GMT+0", "GMT-0"}
    | {
        f"Etc/{name}"
        for name in ("UTC", "UCT", "GMT", "Universal", "Zulu", "Greenwich", "GMT0", "GMT+0", "GMT-0")
    }
)
_ETC_GMT_OFFSET = re.compile(r"Etc/GMT[+-](?:[1-9]|1[0-4])")


def _fixed_offset_of(zone: tzinfo) -> int | None:
    """Seconds east of UTC if ``zone`` has no transitions at all, else None."""
    if isinstance(zone, timezone):
        return _seconds(zone.utcoffset(None))
    key = getattr(zone, "key", None)
    fixed_name = isinstance(key, str) and (key in _FIXED_ZONE_NAMES or _ETC_GMT_OFFSET.fullmatch(key))
    if isinstance(zone, zoneinfo.ZoneInfo) and fixed_name:
        return _seconds(zone.utcoffset(datetime(2000, 1, 1)))
    return None
