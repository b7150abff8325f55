"""Another registry client in its own process, which a fault test can kill outright.

Usage: ``python -m tests.participant URL ACTION PATH [ARGS...]`` with ACTION ``ephemeral``
(create PATH as an ephemeral node), ``lock`` (enter ``reg.lock(PATH)`` and hold it) or
``member`` (run a sharding service for the job at PATH; ARGS: ``INSTANCE_ID TOTAL``).

Invariant: ``ready`` is printed (and flushed) only once the action is done, so the parent
can rely on it; afterwards the process holds its session until it is killed (SIGKILL:
nothing released, the session must time out) or its stdin closes or it gets SIGTERM
(released and closed cleanly: the ephemeral node or lock goes at once).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from registry.protocol import RegistryCenter

ACTIONS = ("ephemeral", "lock", "member")


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


@contextlib.contextmanager
def start_member(reg: RegistryCenter, path: str, instance_id: str, total: str) -> Iterator[None]:
    """A sharding service for the job at ``path`` (one segment), leaving cleanly on exit."""
    from concurrent.futures import ThreadPoolExecutor

    from sharding import InstanceIdentity, ShardingService, ShardingSettings

    with ThreadPoolExecutor(2) as executor:
        service = ShardingService(
            reg, path.strip("/"), InstanceIdentity.create(instance_id), ShardingSettings(total=int(total)),
            executor=executor,
        )
        service.start()
        try:
            yield
        finally:
            service.stop()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] not in ACTIONS or len(argv) != (5 if argv[1] == "member" else 3):
        print(f"usage: python -m tests.participant URL {{{'|'.join(ACTIONS)}}} PATH [ARGS]", file=sys.stderr)
        return 2
    url, action, path = argv[:3]
    signal.signal(signal.SIGTERM, _terminate)

    import registry

    with contextlib.ExitStack() as stack:
        reg = registry.connect(url)
        stack.callback(reg.close)
        if action == "ephemeral":
            reg.create(path, b"participant", ephemeral=True)
        elif action == "lock":
            stack.enter_context(reg.lock(path))
        else:
            stack.enter_context(start_member(reg, path, *argv[3:]))
        print("ready", flush=True)
        # block until the parent closes our stdin (or kills us)
        while sys.stdin.readline():
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
