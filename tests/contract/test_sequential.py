"""Contract: ``create_sequential`` names are unique and increasing under the prefix's parent."""

from __future__ import annotations

import re
import threading

import pytest

from registry.backends.base import BaseRegistry
from tests.harness import Harness

from . import peer

_NAME = re.compile(r"^(?P<prefix>.*?)(?P<number>\d{10})$")


def _number(path: str, prefix: str) -> int:
    assert path.startswith(prefix), (path, prefix)
    match = _NAME.match(path)
    assert match is not None and match.group("prefix") == prefix, path
    return int(match.group("number"))


def test_increasing_with_ten_digits(reg: BaseRegistry) -> None:
    paths = [reg.create_sequential("/q/item-", bytes([i])) for i in range(5)]
    numbers = [_number(p, "/q/item-") for p in paths]
    assert numbers == sorted(set(numbers)), paths
    for i, path in enumerate(paths):
        assert reg.get(path) == bytes([i])
    assert reg.children("/q") == sorted(p.rpartition("/")[2] for p in paths)
    assert reg.get_node("/q") is not None


def test_top_level_prefix(reg: BaseRegistry) -> None:
    first = reg.create_sequential("/n-")
    second = reg.create_sequential("/n-")
    assert _number(second, "/n-") > _number(first, "/n-")


def test_counter_is_shared_by_prefixes_of_one_parent(reg: BaseRegistry) -> None:
    a = reg.create_sequential("/q/a-")
    b = reg.create_sequential("/q/b-")
    a2 = reg.create_sequential("/q/a-")
    assert _number(a, "/q/a-") < _number(b, "/q/b-") < _number(a2, "/q/a-")


def test_numbers_are_not_reused_after_delete(reg: BaseRegistry) -> None:
    first = reg.create_sequential("/q/x-")
    reg.delete(first)
    second = reg.create_sequential("/q/x-")
    assert _number(second, "/q/x-") > _number(first, "/q/x-")


def test_unique_across_two_clients(harness: Harness, reg: BaseRegistry) -> None:
    clients = [reg, peer(harness, reg)]
    created: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def worker(key: int, client: BaseRegistry) -> None:
        try:
            created[key] = [client.create_sequential("/q/job-", str(key).encode()) for _ in range(10)]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i, clients[i % 2]), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    everything = [p for paths in created.values() for p in paths]
    assert len(everything) == 40
    assert len(set(everything)) == 40
    for key, paths in created.items():
        numbers = [_number(p, "/q/job-") for p in paths]
        assert numbers == sorted(numbers), f"worker {key} saw numbers go down: {numbers}"
        for path in paths:
            assert reg.get(path) == str(key).encode()
    assert len(reg.children("/q")) == 40


def test_ephemeral_sequential(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    path = owner.create_sequential("/members/m-", b"me", ephemeral=True)
    node = reg.get_node(path)
    assert node is not None and node.ephemeral and node.value == b"me"
    persistent = owner.create_sequential("/members/m-", b"p")
    node = reg.get_node(persistent)
    assert node is not None and not node.ephemeral
    owner.close()
    assert not reg.exists(path)
    assert reg.exists(persistent)


@pytest.mark.parametrize("prefix", ["/q/", "q-", "/q//x-", ""])
def test_bad_prefix_is_a_value_error(reg: BaseRegistry, prefix: str) -> None:
    with pytest.raises(ValueError):
        reg.create_sequential(prefix)
