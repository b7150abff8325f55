"""The key ranges an etcd watch with ``exclude`` asks the server for: its span less the
subtree strictly below each hole (``etcd_watch._cut``). A key wrongly kept streams an
excluded subtree back; a key wrongly cut loses a covered node's events."""

from __future__ import annotations

import itertools
import random

from pyetcd.utils import prefix_range_end

from registry.backends.etcd_txn import enc, subtree_prefix
from registry.backends.etcd_watch import _cut


def _span(root: str) -> tuple[bytes, bytes]:
    below = enc(subtree_prefix(root))
    return enc(root), prefix_range_end(below)


def _kept(key: bytes, pieces: list[tuple[bytes, bytes]]) -> bool:
    return any(start <= key < end for start, end in pieces)


def _expected(key: bytes, span: tuple[bytes, bytes], holes: set[str]) -> bool:
    start, end = span
    return start <= key < end and not any(key.startswith(enc(subtree_prefix(hole))) for hole in holes)


def _assert_well_formed(pieces: list[tuple[bytes, bytes]]) -> None:
    """Sorted, non-empty, and apart: two ranges that touch would be one watcher too many."""
    for start, end in pieces:
        assert start < end, pieces
    for (_, end), (start, _) in itertools.pairwise(pieces):
        assert end < start, pieces


def test_every_key_is_kept_unless_strictly_below_a_hole() -> None:
    rng = random.Random(20261130)
    root = "/ns"
    # names that sort right around a hole's "/": "running." before it, "running0" and
    # "running-x" around it, "runningx" after
    leaves = ["running", "running/m", "running/m/deep", "running.", "running-x", "running0", "runningx", "config"]
    keys = [enc(f"{root}/j{n}/{leaf}") for n in range(12) for leaf in leaves]
    keys += [enc(root), enc(f"{root}/j1"), enc("/n"), enc("/ns0"), enc("/ns.x"), enc("/nt")]
    for _ in range(300):
        holes = {f"{root}/j{n}/running" for n in rng.sample(range(12), rng.randint(0, 12))}
        if rng.random() < 0.3:
            holes.add(f"{root}/j{rng.randrange(12)}/running/m")  # inside another hole, or alone
        if rng.random() < 0.3:
            holes.add(f"{root}/j{rng.randrange(12)}")  # a whole job
        if rng.random() < 0.2:
            holes.add("/other/running")  # outside the span
        pieces = _cut(_span(root), holes)
        _assert_well_formed(pieces)
        for key in keys:
            assert _kept(key, pieces) == _expected(key, _span(root), holes), (key, sorted(holes), pieces)


def test_a_hole_per_job_leaves_one_range_between_each_two() -> None:
    """A watch started over 20,000 jobs, each with its running marks excluded."""
    jobs = [f"/ns/job-{n:05d}" for n in range(20_000)]
    holes = {f"{job}/sharding/running" for job in jobs}
    pieces = _cut(_span("/ns"), holes)
    assert len(pieces) == len(jobs) + 1
    _assert_well_formed(pieces)
    for job in (jobs[0], jobs[7_777], jobs[-1]):
        assert _kept(enc(f"{job}/sharding/running"), pieces)  # the hole's own key stays
        assert not _kept(enc(f"{job}/sharding/running/0"), pieces)
        assert _kept(enc(f"{job}/sharding/0/instance"), pieces)


def test_a_span_of_one_key_is_never_cut() -> None:
    assert _cut((enc("/ns/a"), b""), {"/ns"}) == [(enc("/ns/a"), b"")]


def test_holes_that_cover_the_whole_span_leave_nothing() -> None:
    assert _cut((enc("/ns/"), prefix_range_end(enc("/ns/"))), {"/ns"}) == []
