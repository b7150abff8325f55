"""The memory store and a TreeCache keep their nodes out of the garbage collector's
lists: a scheduler holds a dozen nodes per job in each, and every object there made each
full collection — a pause that lands on fires — longer (1,000 jobs: 124,000 objects
before, 70,000 after)."""

from __future__ import annotations

import gc
import uuid

import registry
from registry.recipes.cache import TreeCache
from tests.waiting import wait_for

NODES = 2_000


def test_stored_and_cached_nodes_add_no_tracked_objects() -> None:
    reg = registry.connect(f"memory://gc-footprint-{uuid.uuid4().hex}")
    cache = TreeCache(reg, "/").start()
    try:
        reg.put("/jobs", b"")
        gc.collect()
        before = len(gc.get_objects())
        for i in range(NODES):
            reg.put(f"/jobs/j{i % 50}/n{i}", b"value")
        wait_for(lambda: cache.exists(f"/jobs/j{(NODES - 1) % 50}/n{NODES - 1}"), 10, message="cache")
        assert len(cache.children("/jobs/j0")) == NODES // 50
        gc.collect()
        added = len(gc.get_objects()) - before
        # 2,050 nodes in the store and as many in the cache: a tracked object for each
        # node (or for each parent's set of children) would add thousands
        assert added < NODES // 10, f"{added} tracked objects for {NODES} nodes stored and cached"
    finally:
        cache.close()
        reg.close()
