"""HTTP jobs (``JobType.HTTP``) against a real HTTP server in this process, on memory,
ZooKeeper and etcd: each item is one request carrying its context, a status outside 2xx or
no answer fails that item only, the job's client is shared and closed when the job stops,
bad props and a missing extra are refused at ``add_job``, and ``shardjob worker --job-type
http --prop ...`` runs one.

Invariant: the server decides nothing by timing; a request it holds (``/slow``) is released
at teardown, and every wait on the scheduler is bounded (``wait_for``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduler import (
    HttpJobFailed,
    JobConfig,
    JobListener,
    JobRun,
    JobTimeout,
    JobType,
    Scheduler,
    ShardingContext,
)
from scheduler.http_job import HttpItemRunner, HttpUnavailable, check_http_props
from scheduler.timeouts import Deadline
from tests.harness import Harness
from tests.scenarios.workers import EVERY_SECOND, REPO_ROOT, Worker
from tests.servers.ports import LOOPBACK, free_port
from tests.waiting import wait_for

#: how long the server holds a ``/slow`` request at most (the test releases it sooner)
HOLD_SECONDS = 10.0


@dataclass(frozen=True)
class Seen:
    """One request as the server received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int

    @property
    def context(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.headers["shardingcontext"])
        return parsed


class Endpoint:
    """A ThreadingHTTPServer on 127.0.0.1, keep-alive on (HTTP/1.1). ``/hook``: 200;
    ``/fail``: 500 with a 300-character body for item 1, 200 for the others; ``/slow``: 200
    once released (``release``), none before. Every response sets a cookie. Counts connections opened and
    closed (by the client: a keep-alive connection ends when its client closes it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Seen] = []
        self.opened = 0
        self.closed = 0
        self.release = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with endpoint.lock:
                    endpoint.opened += 1

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with endpoint.lock:
                        endpoint.closed += 1

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(
                    self.command,
                    self.path,
                    {name.lower(): value for name, value in self.headers.items()},
                    self.rfile.read(length),
                    self.client_address[1],
                )
                with endpoint.lock:
                    endpoint.requests.append(seen)
                if self.path == "/slow":
                    endpoint.release.wait(HOLD_SECONDS)
                failing = self.path == "/fail" and seen.context["shardingItem"] == 1
                payload = b"x" * 300 if failing else b"ok"
                try:
                    self.send_response(500 if failing else 200)
                    self.send_header("Set-Cookie", "session=1; Path=/")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                except OSError:  # a client that timed out has gone
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.server.daemon_threads = True
        # polled every 50 ms: shutdown() at teardown waits for the next poll
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), name="http-endpoint", daemon=True
        )
        self.thread.start()

    def url(self, path: str, userinfo: str = "") -> str:
        host, port = self.server.server_address[:2]
        return f"http://{userinfo + '@' if userinfo else ''}{host!s}:{port}{path}"

    def seen(self) -> list[Seen]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    made = Endpoint()
    try:
        yield made
    finally:
        made.close()


class Runs(JobListener):
    """Every run that ended, and every failure the error handler was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended: list[JobRun] = []
        self.handled: list[tuple[int, BaseException]] = []

    def after_job(self, run: JobRun) -> None:
        with self.lock:
            self.ended.append(run)

    def handler(self, ctx: ShardingContext, exc: BaseException) -> None:
        with self.lock:
            self.handled.append((ctx.sharding_item, exc))

    def count(self) -> int:
        with self.lock:
            return len(self.ended)


def http_config(uri: str, *, total: int = 1, name: str = "web", **fields: Any) -> JobConfig:
    props = {"http.uri": uri, "http.method": "POST", **fields.pop("props", {})}
    return JobConfig(name=name, sharding_total_count=total, job_type=JobType.HTTP, props=props, **fields)


def start(harness: Harness, namespace: str, made: list[Scheduler], config: JobConfig, runs: Runs) -> Scheduler:
    sched = Scheduler(harness.url(namespace, session_timeout=harness.min_session_timeout), max_workers=4)
    made.append(sched)
    sched.add_job(config, listeners=[runs], error_handler=runs.handler)
    sched.start()
    wait_for(lambda: sched.runner(config.name).sharding.registered, 20, message="the job is registered")
    return sched


def run_once(sched: Scheduler, runs: Runs, name: str = "web") -> JobRun:
    before = runs.count()
    sched.trigger(name)
    wait_for(lambda: runs.count() > before, 20, message=f"run {before + 1} of {name} ends")
    with runs.lock:
        return runs.ended[before]


# -- one request per item ----------------------------------------------------------------------
def test_each_item_is_one_request_with_its_context_once_per_fire(
    harness: Harness, namespace: str, made: list[Scheduler], endpoint: Endpoint
) -> None:
    """Two fires of 3 items: 6 requests, each (fire, item) once, each with the method, body,
    content type and the item's context in ``shardingContext`` (a non-ASCII parameter
    escaped, so the header is ASCII). The server's cookie is never sent back, and the
    requests share connections: one client for every item and fire."""
    runs = Runs()
    config = http_config(
        endpoint.url("/hook"),
        total=3,
        sharding_item_parameters="0=北京,1=b,2=c",
        job_parameter="daily",
        props={"http.data": '{"x": 1}', "http.content.type": "application/json"},
    )
    sched = start(harness, namespace, made, config, runs)
    first, second = run_once(sched, runs), run_once(sched, runs)
    assert first.succeeded and second.succeeded, (first.errors, second.errors)
    seen = endpoint.seen()
    assert sorted((r.context["fireTime"], r.context["shardingItem"]) for r in seen) == sorted(
        (run.fire_time, item) for run in (first, second) for item in (0, 1, 2)
    )
    for request in seen:
        ctx = request.context
        assert (request.method, request.path, request.body) == ("POST", "/hook", b'{"x": 1}')
        assert request.headers["content-type"] == "application/json"
        assert request.headers["shardingcontext"].isascii()
        assert ctx["jobName"] == "web" and ctx["jobParameter"] == "daily" and ctx["shardingTotalCount"] == 3
        assert ctx["shardingParameter"] == {0: "北京", 1: "b", 2: "c"}[ctx["shardingItem"]]
        assert "cookie" not in request.headers, "a cookie from an earlier response was sent"
    ports = {request.client_port for request in seen}
    assert len(ports) < len(seen), f"{len(seen)} requests on {len(ports)} connections: no connection reused"


def test_the_client_is_closed_when_the_job_stops(
    harness: Harness, namespace: str, made: list[Scheduler], endpoint: Endpoint
) -> None:
    """After ``remove_job`` every keep-alive connection of the job is closed by the client
    (the test holds the job's runner, so only ``close()`` can close them)."""
    runs = Runs()
    sched = start(harness, namespace, made, http_config(endpoint.url("/hook"), total=2), runs)
    assert run_once(sched, runs).succeeded
    runner = sched.runner("web")  # referenced to the end: its client is not collected, only closed
    assert runner.name == "web"
    with endpoint.lock:
        assert endpoint.opened > endpoint.closed, "no connection was kept alive to close"
    sched.remove_job("web")

    def all_closed() -> bool:
        with endpoint.lock:
            return endpoint.closed == endpoint.opened

    wait_for(
        all_closed,
        10,
        message=lambda: f"{endpoint.opened - endpoint.closed} connection(s) still open after remove_job",
    )


def test_a_client_closed_mid_request_lets_it_finish_and_a_later_item_gets_its_own(endpoint: Endpoint) -> None:
    """``close()`` while an item waits on its answer: the request still completes, then
    the connection closes; an item after ``close()`` is sent on a client of its own, which
    is closed after it (the shutdown that does not wait for running items)."""
    runner = HttpItemRunner(check_http_props({"http.uri": endpoint.url("/slow"), "http.method": "GET"}))
    ctx = ShardingContext("web", "web@-@0", 1, "", 0, None, 1.0, 1)
    failures: list[BaseException] = []

    def item() -> None:
        try:
            runner(ctx, lambda: True)
        except BaseException as exc:
            failures.append(exc)

    sending = threading.Thread(target=item)
    sending.start()
    wait_for(lambda: endpoint.seen(), 10, message="the request reaches the server")
    runner.close()
    assert sending.is_alive(), f"the request ended at close(): {failures}"
    endpoint.release.set()
    sending.join(10)
    assert not sending.is_alive() and failures == []

    def all_closed() -> bool:
        with endpoint.lock:
            return endpoint.opened == endpoint.closed

    wait_for(all_closed, 10, message="the job's connection is closed once its request ended")
    runner(ctx, lambda: True)
    wait_for(all_closed, 10, message="the connection of an item after close() is closed")
    assert [r.path for r in endpoint.seen()] == ["/slow", "/slow"]
    with endpoint.lock:
        assert endpoint.opened == 2


# -- failures -------------------------------------------------------------------------------------
def test_a_500_fails_that_item_only_naming_method_masked_url_status_and_body(
    harness: Harness, namespace: str, made: list[Scheduler], endpoint: Endpoint
) -> None:
    runs = Runs()
    url = endpoint.url("/fail", userinfo="ops:s3cret")
    sched = start(harness, namespace, made, http_config(url, total=3), runs)
    run = run_once(sched, runs)
    assert sorted(r.context["shardingItem"] for r in endpoint.seen()) == [0, 1, 2]
    assert set(run.errors) == {1}, run.errors
    error = run.errors[1]
    assert isinstance(error, HttpJobFailed) and error.status == 500
    assert [(item, exc) for item, exc in runs.handled] == [(1, error)]
    message = str(error)
    masked = endpoint.url("/fail", userinfo="ops:***")
    assert message.startswith(f"POST {masked}: status 500")
    assert "s3cret" not in message and error.url == masked
    assert "x" * 200 + "..." in message and "x" * 201 not in message


def test_no_answer_within_the_read_timeout_fails_naming_url_and_timeout(
    harness: Harness, namespace: str, made: list[Scheduler], endpoint: Endpoint
) -> None:
    """The server holds the request; the item fails after the 300 ms read timeout (well
    before the 5 s default), the message naming the URL and the timeout."""
    runs = Runs()
    url = endpoint.url("/slow")
    config = http_config(url, props={"http.method": "GET", "http.read.timeout.milliseconds": "300"})
    sched = start(harness, namespace, made, config, runs)
    run = run_once(sched, runs)
    error = run.errors.get(0)
    assert isinstance(error, HttpJobFailed) and error.status is None, run.errors
    assert str(error) == f"GET {url}: no response within 300 ms (http.read.timeout.milliseconds)"
    assert run.finished is not None and run.finished - run.started < 4.0, "the 300 ms read timeout was not applied"
    assert [r.path for r in endpoint.seen()] == ["/slow"]


def test_the_jobs_timeout_ends_a_request_still_waiting(
    harness: Harness, namespace: str, made: list[Scheduler], endpoint: Endpoint
) -> None:
    """timeout_seconds 0.3 with the default 5 s read timeout: the request is given up at the
    attempt's deadline and the item fails with JobTimeout."""
    runs = Runs()
    config = http_config(endpoint.url("/slow"), props={"http.method": "GET"}, timeout_seconds=0.3)
    sched = start(harness, namespace, made, config, runs)
    run = run_once(sched, runs)
    assert isinstance(run.errors.get(0), JobTimeout), run.errors
    assert run.finished is not None and run.finished - run.started < 3.0, "the request outlived the job's timeout"


def test_a_request_cut_at_the_deadline_expires_it_though_no_timer_did(endpoint: Endpoint) -> None:
    """The request's timeout is cut to the attempt's deadline. When that timeout ends the
    request before the timer has expired the deadline (a loaded machine), the deadline is
    expired there and then: the item fails as the job's timeout (the runner maps an
    expired deadline to ``JobTimeout``), not as the URL's read timeout."""
    runner = HttpItemRunner(check_http_props({"http.uri": endpoint.url("/slow"), "http.method": "GET"}))
    deadline = Deadline(0.3)  # armed on no timer: only the request can expire it
    ctx = dataclasses.replace(ShardingContext("web", "web@-@0", 1, "", 0, None, 1.0, 1), deadline=deadline)
    try:
        with pytest.raises(HttpJobFailed):
            runner(ctx, lambda: True)
        assert deadline.expired
    finally:
        endpoint.release.set()
        runner.close()


def test_a_refused_connection_fails_naming_the_url(harness: Harness, namespace: str, made: list[Scheduler]) -> None:
    runs = Runs()
    url = f"http://{LOOPBACK}:{free_port()}/nobody"
    sched = start(harness, namespace, made, http_config(url), runs)
    error = run_once(sched, runs).errors.get(0)
    assert isinstance(error, HttpJobFailed) and error.status is None
    assert str(error).startswith(f"POST {url}: ConnectError")


# -- add_job ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("props", "names"),
    [
        ({"http.method": "GET"}, "props 'http.uri' '': an HTTP job needs an http:// or https:// URL"),
        ({"http.uri": "ftp://ops:s3cret@h/x", "http.method": "GET"}, "props 'http.uri' 'ftp://ops:***@h/x'"),
        ({"http.uri": "http://h:http/x", "http.method": "GET"}, "props 'http.uri' 'http://h:http/x': Port"),
        ({"http.uri": "http://h/x", "http.method": "FETCH"}, "props 'http.method' 'FETCH'"),
        ({"http.uri": "http://h/x", "http.method": "HEAD", "http.data": "x"}, "props 'http.data': a HEAD request"),
        (
            {"http.uri": "http://h/x", "http.method": "GET", "http.connect.timeout.milliseconds": "0"},
            "props 'http.connect.timeout.milliseconds' '0'",
        ),
    ],
)
def test_bad_props_are_refused_before_anything_is_written(
    harness: Harness, namespace: str, props: dict[str, str], names: str
) -> None:
    """``JobConfig`` checks an HTTP job's props as it is made, so a bad one never reaches
    ``add_job``, let alone the registry; a URL's password stays out of the message."""
    sched = Scheduler(harness.url(namespace))
    with pytest.raises(ValueError, match=re.escape(names)) as raised:
        sched.add_job(JobConfig(name="web", job_type=JobType.HTTP, props=props))
    assert "s3cret" not in str(raised.value)
    assert sched.jobs == []
    assert harness.connect(namespace).children("/") == []


def test_add_job_refuses_a_function_for_an_http_job(harness: Harness, namespace: str) -> None:
    sched = Scheduler(harness.url(namespace))
    with pytest.raises(ValueError, match="an HTTP job takes no function"):
        sched.add_job(http_config("http://h/x"), lambda ctx: None)
    assert sched.jobs == []


def test_add_job_without_httpx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx not importable (None in ``sys.modules`` makes ``import httpx`` fail): adding an
    HTTP job fails at once, naming the pip install; the other kinds are unaffected."""
    monkeypatch.setitem(sys.modules, "httpx", None)
    sched = Scheduler("memory://http-without-httpx")
    with pytest.raises(HttpUnavailable, match=re.escape("pip install 'shardjob[http]'")):
        sched.add_job(http_config("http://h/x"))
    sched.add_job(JobConfig(name="simple"), lambda ctx: None)
    assert sched.jobs == ["simple"]


# -- shardjob worker ---------------------------------------------------------------------------------
def test_worker_runs_an_http_job_from_props_on_the_command_line(endpoint: Endpoint, tmp_path: Path) -> None:
    argv = [
        "worker",
        "--registry",
        f"memory://http-{tmp_path.name}",
        "--job-type",
        "http",
        "--name",
        "web",
        "--cron",
        EVERY_SECOND,
        "--total",
        "2",
        "--prop",
        f"http.uri={endpoint.url('/hook')}",
        "--prop",
        "http.method=PUT",
        "--prop",
        "http.data=a=b",
    ]
    worker = Worker("127.0.0.1@-@http", argv, tmp_path, hold=0.0)
    try:
        wait_for(
            lambda: {r.context["shardingItem"] for r in endpoint.seen()} == {0, 1},
            20,
            interval=0.1,
            message=lambda: f"both items requested:\n{worker.describe()}",
        )
        assert worker.terminate(sig=signal.SIGTERM) == 0, worker.describe()
    finally:
        worker.kill()
    for request in endpoint.seen():
        assert (request.method, request.body, request.context["jobName"]) == ("PUT", b"a=b", "web")
    assert "Traceback" not in worker.stderr_file.read_text()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--prop", "http.uri"], "--prop 'http.uri': expected KEY=VALUE"),
        (["--prop", "http.method=GET", "--prop", "http.method=PUT"], "--prop http.method: given twice"),
        (["--prop", "http.method=GET"], "props 'http.uri' ''"),
    ],
)
def test_worker_with_bad_props_exits_2_naming_them(args: list[str], names: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "worker", "--registry", "memory://http-bad",
         "--job-type", "http", "--name", "web", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert names in done.stderr and "Traceback" not in done.stderr
