"""``get_strategy(name)``: built-in names, ``module:attr``, or an entry point; and the
check that every strategy's result must pass before anything is written.

Invariant: whatever a strategy returns, what leaves :func:`check_assignment` covers each
item exactly once, names only given instances, and lists every given instance.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

from sharding.strategies import avg_allocation, odevity, round_robin, sticky

__all__ = [
    "BUILTIN_STRATEGIES",
    "ENTRY_POINT_GROUP",
    "Strategy",
    "check_assignment",
    "get_strategy",
    "import_object",
]

ENTRY_POINT_GROUP = "shardjob.sharding_strategies"


class Strategy(Protocol):
    def __call__(self, instances: Sequence[str], job_name: str, total: int, /) -> dict[str, list[int]]: ...


BUILTIN_STRATEGIES: dict[str, Callable[..., dict[str, list[int]]]] = {
    "AVG_ALLOCATION": avg_allocation,
    "ODEVITY": odevity,
    "ROUND_ROBIN": round_robin,
    "STICKY": sticky,
}


def accepts_previous(strategy: object) -> bool:
    """Whether the strategy takes ``previous=`` (the last assignment), like STICKY."""
    return bool(getattr(strategy, "accepts_previous", False))


def check_assignment(
    result: object, instances: Sequence[str], total: int, strategy_name: str
) -> dict[str, list[int]]:
    """Validate and normalise a strategy's result; ``ValueError`` naming the fault."""
    where = f"sharding strategy {strategy_name!r}"
    if not isinstance(result, Mapping):
        raise ValueError(f"{where} returned {type(result).__name__}, not a mapping of instance to items")
    known = set(instances)
    normalised: dict[str, list[int]] = {instance: [] for instance in instances}
    owner: dict[int, str] = {}
    for instance, items in result.items():
        if instance not in known:
            raise ValueError(f"{where} assigned items to unknown instance {instance!r}")
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence | set | frozenset):
            raise ValueError(f"{where} gave instance {instance!r} {items!r}, not a list of items")
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < total:
                raise ValueError(f"{where} assigned item {item!r} outside 0..{total - 1} to {instance!r}")
            if item in owner:
                raise ValueError(f"{where} assigned item {item} twice (to {owner[item]!r} and {instance!r})")
            owner[item] = instance
            normalised[instance].append(item)
    if instances and len(owner) != total:
        missing = sorted(set(range(total)) - set(owner))
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise ValueError(f"{where} left {len(missing)} item(s) unassigned: {shown}")
    for items in normalised.values():
        items.sort()
    return normalised


def _validated(strategy: Callable[..., Any], name: str) -> Callable[..., dict[str, list[int]]]:
    def run(instances: Sequence[str], job_name: str, total: int, **kwargs: Any) -> dict[str, list[int]]:
        units = list(instances)
        return check_assignment(strategy(units, job_name, total, **kwargs), units, total, name)

    run.accepts_previous = accepts_previous(strategy)  # type: ignore[attr-defined]
    run.__name__ = f"validated_{name}"
    return run


def import_object(spec: str, what: str) -> Any:
    """The object named by ``"package.module:attr"`` (``attr`` may be dotted); a
    ``ValueError`` naming ``what`` and the fault otherwise. Shared with the CLI's ``--job``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {spec!r}: expected 'package.module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    return target


def _as_callable(target: Any, name: str) -> Callable[..., Any]:
    if inspect.isclass(target):
        target = target()
    method = getattr(target, "sharding", None)  # ElasticJob-style strategy objects
    if callable(method):
        return method  # type: ignore[no-any-return]
    if not callable(target):
        raise ValueError(f"sharding strategy {name!r} is not callable")
    return target  # type: ignore[no-any-return]


def get_strategy(name: str) -> Callable[..., dict[str, list[int]]]:
    """The strategy called ``name``: built-in, ``module:attr``, or an entry point of
    group ``shardjob.sharding_strategies``. Unknown names: ``ValueError`` listing the known."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"sharding strategy name must be a non-empty str, got {name!r}")
    builtin = BUILTIN_STRATEGIES.get(name.upper())
    if builtin is not None:
        return builtin
    if ":" in name:
        return _validated(_as_callable(import_object(name, "sharding strategy"), name), name)
    plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in plugins:
        try:
            loaded = plugins[name].load()
        except Exception as exc:
            raise ValueError(f"sharding strategy {name!r}: entry point failed to load: {exc}") from None
        return _validated(_as_callable(loaded, name), name)
    known = sorted(BUILTIN_STRATEGIES) + sorted(plugins)
    raise ValueError(
        f"unknown sharding strategy {name!r}; known: {', '.join(known)}, or 'package.module:attr'"
    )
