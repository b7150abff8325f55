"""ElasticJob's strategies give ElasticJob's results; STICKY moves as little as it may."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding import get_strategy, java_string_hash
from sharding.strategies import avg_allocation, odevity, round_robin, sticky

BUILTINS = ["AVG_ALLOCATION", "ODEVITY", "ROUND_ROBIN", "STICKY"]


# -- Java's String.hashCode --------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # the Math.abs edge case
        ("中文作业", 621834424),
        ("😀job", 1276931962),  # a surrogate pair counts as two UTF-16 units
    ],
)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_java_string_hash_is_the_recurrence_over_utf16_units() -> None:
    text = "作业-😀-x"
    units = [
        int.from_bytes(text.encode("utf-16-be")[i : i + 2], "big") for i in range(0, 2 * len(text) + 2, 2)
    ]
    units = units[: len(text.encode("utf-16-be")) // 2]
    h = 0
    for unit in units:
        h = (31 * h + unit) % 2**32
    assert java_string_hash(text) == (h - 2**32 if h >= 2**31 else h)


# -- the seed texts' examples ------------------------------------------------------------
@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (9, {"1": [0, 1, 2], "2": [3, 4, 5], "3": [6, 7, 8]}),
        (8, {"1": [0, 1, 6], "2": [2, 3, 7], "3": [4, 5]}),
        (10, {"1": [0, 1, 2, 9], "2": [3, 4, 5], "3": [6, 7, 8]}),
    ],
)
def test_avg_allocation_seed_examples(total: int, expected: dict[str, list[int]]) -> None:
    assert get_strategy("AVG_ALLOCATION")(["1", "2", "3"], "any", total) == expected


def _job_with_parity(even: bool) -> str:
    return next(f"job{i}" for i in range(100) if (java_string_hash(f"job{i}") % 2 == 0) == even)


def test_odevity_seed_examples() -> None:
    odd, even = _job_with_parity(False), _job_with_parity(True)
    assert odevity(["1", "2", "3"], odd, 2) == {"1": [0], "2": [1], "3": []}
    assert odevity(["1", "2", "3"], even, 2) == {"3": [0], "2": [1], "1": []}


def test_round_robin_rotates_left_by_hash_mod_n() -> None:
    name = "job-a"
    offset = abs(java_string_hash(name)) % 3
    units = ["x", "y", "z"]
    rotated = units[offset:] + units[:offset]
    assert round_robin(units, name, 3) == {rotated[0]: [0], rotated[1]: [1], rotated[2]: [2]}


def test_round_robin_survives_min_int_hash() -> None:
    assert java_string_hash("polygenelubricants") == -(2**31)
    result = round_robin(["a", "b", "c"], "polygenelubricants", 3)
    # |-2**31| = 2**31 and 2**31 % 3 == 2: rotated left by two
    assert result == {"c": [0], "a": [1], "b": [2]}


def test_empty_instances_give_empty_result() -> None:
    for name in BUILTINS:
        assert get_strategy(name)([], "job", 5) == {}


def test_callers_list_is_never_mutated() -> None:
    units = ["3", "2", "1"]
    even = _job_with_parity(True)
    for name in BUILTINS:
        get_strategy(name)(units, even, 7)
        assert units == ["3", "2", "1"]


def test_unknown_strategy_lists_known_names() -> None:
    with pytest.raises(ValueError) as info:
        get_strategy("NOPE")
    message = str(info.value)
    for name in BUILTINS:
        assert name in message


def test_duplicate_instances_rejected() -> None:
    with pytest.raises(ValueError, match="repeated"):
        avg_allocation(["a", "a"], "job", 2)


# -- properties ----------------------------------------------------------------------
instance_lists = st.lists(st.text(min_size=1, max_size=8), min_size=0, max_size=12, unique=True)
totals = st.integers(min_value=0, max_value=200)
names = st.text(max_size=20)


@settings(max_examples=200, deadline=None)
@given(instances=instance_lists, job=names, total=totals, name=st.sampled_from(BUILTINS))
def test_every_strategy_covers_each_item_exactly_once(
    instances: list[str], job: str, total: int, name: str
) -> None:
    result = get_strategy(name)(instances, job, total)
    if not instances:
        assert result == {}
        return
    assert set(result) == set(instances)
    items = [i for owned in result.values() for i in owned]
    assert sorted(items) == list(range(total))


@settings(max_examples=200, deadline=None)
@given(instances=instance_lists.filter(bool), job=names, total=totals)
def test_avg_balance_within_one_item(instances: list[str], job: str, total: int) -> None:
    sizes = [len(v) for v in avg_allocation(instances, job, total).values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=300, deadline=None)
@given(
    before=instance_lists.filter(bool),
    after=instance_lists.filter(bool),
    total=st.integers(min_value=1, max_value=200),
    job=names,
)
def test_sticky_keeps_items_of_owners_within_their_fair_share(
    before: list[str], after: list[str], total: int, job: str
) -> None:
    previous = avg_allocation(before, job, total)
    result = sticky(after, job, total, previous=previous)
    assert sorted(i for owned in result.values() for i in owned) == list(range(total))
    share = math.ceil(total / len(after))
    for owner, items in previous.items():
        if owner in after and len(items) <= share:
            assert set(items) <= set(result[owner]), f"{owner} lost items while within its share"
    assert max(len(v) for v in result.values()) <= share


def test_sticky_is_deterministic_and_starts_as_avg() -> None:
    units = [f"10.0.0.{i}@-@1" for i in range(5)]
    assert sticky(units, "j", 23) == avg_allocation(units, "j", 23)
    previous = avg_allocation(units, "j", 23)
    assert sticky(units[:4], "j", 23, previous=previous) == sticky(units[:4], "j", 23, previous=previous)


def _moved(previous: dict[str, list[int]], current: dict[str, list[int]]) -> int:
    owner = {i: k for k, v in previous.items() for i in v}
    return sum(1 for k, v in current.items() for i in v if owner.get(i) != k)


def test_sticky_moves_far_fewer_items_than_avg_on_join_and_leave() -> None:
    ten = sorted((f"10.0.0.{i}@-@1" for i in range(10)), reverse=True)
    eleven = sorted([*ten, "10.0.0.99@-@1"], reverse=True)
    nine = ten[1:]
    base = avg_allocation(ten, "j", 1000)
    join_avg = _moved(base, avg_allocation(eleven, "j", 1000))
    join_sticky = _moved(base, sticky(eleven, "j", 1000, previous=base))
    leave_avg = _moved(base, avg_allocation(nine, "j", 1000))
    leave_sticky = _moved(base, sticky(nine, "j", 1000, previous=base))
    # the minimum possible: the newcomer's share on a join, the leaver's items on a leave
    assert join_sticky == 1000 - 10 * math.ceil(1000 / 11)  # 90: the old owners shed down to their share
    assert leave_sticky == 100  # exactly the leaver's items
    assert join_sticky < join_avg and leave_sticky < leave_avg
