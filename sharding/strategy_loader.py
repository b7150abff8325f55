"""``get_strategy(name)``: built-in names, ``module:attr``, or an entry point; and the
check that every strategy's result must pass before anything is written.

Invariant: whatever a strategy returns, what leaves :func:`check_assignment` covers each
item exactly once, names only given instances, and lists every given instance.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sharding.strategies import avg_allocation, odevity, round_robin, sticky

__all__ = [
    "BUILTIN_STRATEGIES",
    "ENTRY_POINT_GROUP",
    "LoadedStrategy",
    "Strategy",
    "check_assignment",
    "get_strategy",
    "import_object",
]

ENTRY_POINT_GROUP = "shardjob.sharding_strategies"


class Strategy(Protocol):
    """What a strategy is: instances (in ElasticJob's order), job name and item count in,
    the items of each instance out."""

    def __call__(self, instances: Sequence[str], job_name: str, total: int, /) -> dict[str, list[int]]: ...


@dataclass(frozen=True)
class LoadedStrategy:
    """A strategy as ``get_strategy`` hands it out: called like one, and saying whether it
    takes ``previous=`` (the last assignment, for STICKY's fewest moves)."""

    name: str
    function: Callable[..., dict[str, list[int]]]
    accepts_previous: bool = False

    def __call__(
        self,
        instances: Sequence[str],
        job_name: str,
        total: int,
        *,
        previous: Mapping[str, Sequence[int]] | None = None,
    ) -> dict[str, list[int]]:
        if self.accepts_previous:
            return self.function(instances, job_name, total, previous=previous)
        return self.function(instances, job_name, total)


BUILTIN_STRATEGIES: dict[str, LoadedStrategy] = {
    "AVG_ALLOCATION": LoadedStrategy("AVG_ALLOCATION", avg_allocation),
    "ODEVITY": LoadedStrategy("ODEVITY", odevity),
    "ROUND_ROBIN": LoadedStrategy("ROUND_ROBIN", round_robin),
    "STICKY": LoadedStrategy("STICKY", sticky, accepts_previous=True),
}


def _takes_previous(strategy: Callable[..., Any]) -> bool:
    """Whether a user's strategy declares a ``previous`` parameter (or the old marker)."""
    if getattr(strategy, "accepts_previous", False):
        return True
    try:
        return "previous" in inspect.signature(strategy).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False


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


def _validated(strategy: Callable[..., Any], name: str) -> LoadedStrategy:
    """A user's strategy, its every result checked before anything is written."""

    def run(instances: Sequence[str], job_name: str, total: int, **kwargs: Any) -> dict[str, list[int]]:
        units = list(instances)
        return check_assignment(strategy(units, job_name, total, **kwargs), units, total, name)

    return LoadedStrategy(name, run, accepts_previous=_takes_previous(strategy))


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


def _as_callable(target: object, name: str) -> Callable[..., Any]:
    if inspect.isclass(target):
        target = target()
    method: object = getattr(target, "sharding", None)  # ElasticJob-style strategy objects
    if callable(method):
        return method
    if not callable(target):
        raise ValueError(f"sharding strategy {name!r} is not callable")
    return target


def get_strategy(name: str) -> LoadedStrategy:
    """The strategy called ``name``: built-in, ``module:attr``, or an entry point of
    group ``shardjob.sharding_strategies``. Unknown names: ``ValueError`` listing the known."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"sharding strategy name must be a non-empty str, got {name!r}")
    builtin = BUILTIN_STRATEGIES.get(name.upper())
    if builtin is not None:
        return builtin
    if ":" in name:
        return _validated(_as_callable(import_object(name, "sharding strategy"), name), name)
    from importlib.metadata import entry_points  # plugins only: it costs MiBs (registry.release)

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
