"""The memory store and a TreeCache keep their nodes out of the garbage collector's
lists: a scheduler holds a dozen nodes per job in each, and every object there made each
full collection — a pause that lands on fires — longer (1,000 jobs: 124,000 objects
before, 70,000 after)."""

from __future__ import annotations

import gc
import uuid

import registry
from registry.backends.memory import MemoryRegistry, MemoryStore
from registry.protocol import Check, Set
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


def test_the_store_keeps_each_node_in_its_smallest_shape() -> None:
    """A persistent node with an empty value (a job's parents, seven of its thirteen
    nodes) is stored as its bare version, one with a value as (value, version), and only
    an ephemeral node names its session; a node moves between the shapes as its value
    changes, and reads, transactions and the session's end see it as the registry has it."""
    name = f"shapes-{uuid.uuid4().hex}"
    reg = registry.connect(f"memory://{name}")
    assert isinstance(reg, MemoryRegistry)
    store = MemoryStore.named(name)
    try:
        reg.put("/p/leaf", b"v")
        reg.create("/p/mine", b"", ephemeral=True)
        assert [_shape(store, p) for p in ("/p", "/p/leaf", "/p/mine")] == ["version", "pair", "triple"]
        node = reg.get_node("/p")
        assert node is not None and (node.value, node.version, node.ephemeral) == (b"", store._nodes["/p"], False)
        reg.put("/p", b"x")
        assert _shape(store, "/p") == "pair" and reg.get("/p") == b"x"
        node, mine = reg.get_node("/p"), reg.get_node("/p/mine")
        assert node is not None and mine is not None
        reg.transaction([Set("/p", b"", node.version), Check("/p/mine", mine.version)])
        assert _shape(store, "/p") == "version" and reg.get("/p") == b""
        reg.put("/p/mine", b"y")
        mine = reg.get_node("/p/mine")
        assert mine is not None and mine.ephemeral and _shape(store, "/p/mine") == "triple"
        store.expire(reg)
        wait_for(lambda: "/p/mine" not in store._nodes, 10, message="ephemeral gone with its session")
        assert "/p/leaf" in store._nodes and "/p" in store._nodes
    finally:
        reg.close()


def _shape(store: MemoryStore, path: str) -> str:
    entry = store._nodes[path]
    if isinstance(entry, int):
        return "version"
    return {2: "pair", 3: "triple"}[len(entry)]
