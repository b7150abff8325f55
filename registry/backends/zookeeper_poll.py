"""kazoo's threading handler with a cheaper ``select`` and a bounded TCP connect.

kazoo's connection thread calls ``handler.select`` before every request it writes and on
every turn of its loop; the stock one builds an epoll selector each time (four system
calls: create, register, wait, close). This one makes ONE ``poll(2)`` call, with no limit
on descriptor numbers either, and keeps the stock function's contract: ready read
objects, ready write objects, and an empty list (``xlist`` is never waited on).

``connect_timeout``, when set, caps the TCP connect of each connection attempt: kazoo
asks for the whole session timeout (see ``zookeeper_connect``).
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

__all__ = ["PollingHandler"]

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT


def _fd(fileobj: Any) -> int:
    fd = fileobj if isinstance(fileobj, int) else int(fileobj.fileno())
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd}")
    return fd


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """``SequentialThreadingHandler`` whose ``select`` is one ``poll(2)`` call."""

    def __init__(self, connect_timeout: float | None = None) -> None:
        super().__init__()
        #: seconds a TCP connect may take at most (None: what kazoo asks for)
        self.connect_timeout = connect_timeout

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        timeout = kwargs.get("timeout")
        if self.connect_timeout is not None and timeout is not None:
            kwargs["timeout"] = min(timeout, self.connect_timeout)
        return super().create_connection(*args, **kwargs)

    def select(
        self,
        rlist: Sequence[Any],
        wlist: Sequence[Any],
        xlist: Sequence[Any],
        timeout: float | None = None,
    ) -> tuple[list[Any], list[Any], list[Any]]:
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        poller = select.poll()
        wanted: dict[int, int] = {}
        owners: dict[int, list[Any]] = {}
        for fileobjs, mask in ((rlist, _READ), (wlist, _WRITE)):
            for fileobj in fileobjs:
                fd = _fd(fileobj)
                wanted[fd] = wanted.get(fd, 0) | mask
                owners.setdefault(fd, []).append(fileobj)
        for fd, mask in wanted.items():
            poller.register(fd, mask)
        readable: list[Any] = []
        writable: list[Any] = []
        # events mapped as selectors.PollSelector maps them (an error or hang-up counts as
        # readable), and sorted as kazoo's selector_select sorts them: readable, else writable
        for fd, event in poller.poll(None if timeout is None else timeout * 1000.0):
            if event & ~select.POLLOUT:
                readable.extend(owners[fd])
            elif event & ~select.POLLIN:
                writable.extend(owners[fd])
        return readable, writable, []
