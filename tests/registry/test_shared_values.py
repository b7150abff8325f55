"""registry/shared_values.py: equal small values and numbers come back as one object,
long values as themselves, and a full table starts again without losing a value."""

from __future__ import annotations

import pytest

import registry.shared_values as shared_values
from registry.shared_values import shared_number, shared_pair, shared_value


def _fresh_bytes(text: str) -> bytes:
    return bytes(bytearray(text.encode()))  # equal to the literal, an object of its own


def _fresh_int(n: int) -> int:
    return int(str(n))


def test_equal_values_come_back_as_the_first_object_seen() -> None:
    first, second = _fresh_bytes("ENABLED-test"), _fresh_bytes("ENABLED-test")
    assert first is not second
    assert shared_value(first) is first
    assert shared_value(second) is first


def test_a_value_longer_than_512_bytes_is_its_own() -> None:
    first, second = _fresh_bytes("x" * 513), _fresh_bytes("x" * 513)
    assert shared_value(first) is first
    assert shared_value(second) is second


def test_equal_numbers_come_back_as_the_first_object_seen() -> None:
    big = (7 << 32) | 3
    first, second = _fresh_int(big), _fresh_int(big)
    assert first is not second
    assert shared_number(first) is first
    assert shared_number(second) is first
    assert shared_number(_fresh_int(-2)) == -2


def test_equal_pairs_come_back_as_the_first_tuple_seen() -> None:
    big = (9 << 32) | 5
    first = shared_pair(_fresh_bytes("pair-test"), _fresh_int(big))
    assert shared_pair(_fresh_bytes("pair-test"), _fresh_int(big)) is first
    assert first == (b"pair-test", big)
    assert shared_pair(_fresh_bytes("pair-test"), big + 1) == (b"pair-test", big + 1)
    long_value = _fresh_bytes("y" * 513)
    assert shared_pair(long_value, big) is not shared_pair(_fresh_bytes("y" * 513), big)


def test_a_pair_holds_the_value_object_kept_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The value table was cleared since an equal pair was kept: the pair given holds the
    value object kept now, the one a node kept as its bare value holds."""
    monkeypatch.setattr(shared_values, "_values", {})
    monkeypatch.setattr(shared_values, "_pairs", {})
    old = shared_pair(_fresh_bytes("pair-kept"), 7)
    shared_values._values.clear()
    bare = shared_value(_fresh_bytes("pair-kept"))
    assert bare is not old[0]
    pair = shared_pair(_fresh_bytes("pair-kept"), 7)
    assert pair[0] is bare and pair == old
    assert shared_pair(_fresh_bytes("pair-kept"), 7) is pair


def test_a_full_table_starts_again_and_still_gives_equal_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_values, "_TABLE_SIZE", 8)
    monkeypatch.setattr(shared_values, "_values", {})
    monkeypatch.setattr(shared_values, "_numbers", {})
    for i in range(100):
        value = _fresh_bytes(f"value-{i}")
        assert shared_value(value) == value
        assert shared_number(_fresh_int(1000 + i)) == 1000 + i
        assert len(shared_values._values) <= 8 and len(shared_values._numbers) <= 8
    kept = shared_value(_fresh_bytes("value-99"))
    assert shared_value(_fresh_bytes("value-99")) is kept


def test_a_value_found_in_a_full_table_leaves_the_table_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_values, "_TABLE_SIZE", 4)
    monkeypatch.setattr(shared_values, "_values", {})
    kept = [shared_value(_fresh_bytes(f"kept-{i}")) for i in range(4)]
    for value in kept:
        assert shared_value(_fresh_bytes(value.decode())) is value
    assert list(shared_values._values) == kept
