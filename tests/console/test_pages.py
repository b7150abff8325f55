"""Console pieces that need no registry cluster: the history page's filters and pages over
a real SQLite database, the command line's checks of its arguments, the clear error when
the console extra is missing, the sparkline, and the session cookie's signature."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

import registry
from scheduler.cli import main
from scheduler.console.auth import AdminPassword, Session, SessionCodec, basic_credentials
from scheduler.console.serve import parse_listen
from scheduler.console.sparkline import sparkline_svg
from scheduler.history.engine import make_engine
from scheduler.history.schema import ensure_schema, executions
from tests.console.kit import serve

REPO = Path(__file__).resolve().parents[2]


def write_runs(url: str, count: int) -> None:
    engine = make_engine(url)
    ensure_schema(engine)
    rows = [
        {
            "job_name": "nightly" if i % 2 == 0 else "hourly",
            "task_id": f"t{i}",
            "hostname": "h",
            "ip": "10.0.0.1",
            "instance_id": "10.0.0.1@-@1" if i % 3 else "10.0.0.2@-@2",
            "sharding_item": i % 4,
            "parameter": None,
            "epoch": 1,
            "fire_time": 1_700_000_000.0 + i,
            "execution_source": "NORMAL",
            "start_time": 1_700_000_000.0 + i + 0.01,
            "complete_time": 1_700_000_000.0 + i + 0.5,
            "is_success": i % 5 != 0,
            "outcome": "success" if i % 5 else "failure",
            "failure_cause": None if i % 5 else "boom",
        }
        for i in range(count)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(executions), rows)
    engine.dispose()


def run_rows(html: str) -> int:
    body = html.split('<table id="history">', 1)[1].split("</table>", 1)[0]
    return len(re.findall(r"<tr><td>", body))


def test_history_page_filters_and_pages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    write_runs(url, 230)
    reg = registry.connect(f"memory://pages-{os.getpid()}")
    with serve(reg, history_url=url) as served, httpx.Client(base_url=served.url) as web:
        first = web.get("/history").text
        assert run_rows(first) == 50 and 'id="next-page"' in first and 'id="prev-page"' not in first
        last = web.get("/history?page=5").text
        assert run_rows(last) == 30 and 'id="next-page"' not in last and 'id="prev-page"' in last
        assert run_rows(web.get("/history?job=nightly&page=3").text) == 15  # 115 nightly runs
        assert run_rows(web.get("/history?outcome=failure&page=1").text) == 46
        assert run_rows(web.get("/history?job=hourly&item=1&instance=10.0.0.1%40-%401").text) == 39
        window = web.get("/history?since=2023-11-14T22:13:30&until=2023-11-14T22:13:40").text
        assert run_rows(window) == 10
        bad = web.get("/history?item=one")
        assert bad.status_code == 400 and "item &#39;one&#39;: expected a whole number" in bad.text
    reg.close()


def test_history_page_without_a_database_says_how_to_get_one() -> None:
    reg = registry.connect(f"memory://pages-none-{os.getpid()}")
    with serve(reg) as served:
        assert "--history DB_URL" in httpx.get(f"{served.url}/history").text
    reg.close()


def test_console_command_checks_its_arguments(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDJOB_REGISTRY", raising=False)
    assert main(["console"]) == 2
    assert "no registry" in capsys.readouterr().err
    assert main(["console", "--registry", "memory://x", "--listen", "localhost"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    empty = tmp_path / "password"
    empty.write_text("\n")
    assert main(["console", "--registry", "memory://x", "--password-file", str(empty)]) == 2
    assert "the first line (the password) is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["console", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for option in ("--registry", "--history", "--listen", "--login-required", "--password-file", "SHARDJOB_CONSOLE_PASSWORD"):
        assert option in shown
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    with pytest.raises(ValueError, match="port 'http' is not a number"):
        parse_listen("127.0.0.1:http")


def test_without_the_extra_the_error_names_the_install_command() -> None:
    code = "import sys; sys.modules['starlette'] = None\nimport scheduler.console.app"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert result.returncode != 0
    assert "ConsoleUnavailable" in result.stderr and "pip install 'shardjob[console]'" in result.stderr


def test_sessions_and_passwords() -> None:
    codec = SessionCodec()
    cookie = codec.encode(Session(user="admin"))
    decoded = codec.decode(cookie)
    assert decoded is not None and decoded.admin
    payload, signature = cookie.rsplit(".", 1)
    assert codec.decode(payload + "." + signature[::-1]) is None  # forged signature
    assert SessionCodec().decode(cookie) is None  # another process's secret
    assert codec.decode(codec.encode(Session(user="admin", expires=1.0))) is None  # expired
    password = AdminPassword("s3cret")
    assert password.check("admin", "s3cret") and not password.check("admin", "S3cret")
    assert not password.check("root", "s3cret") and "s3cret" not in repr(password)
    assert basic_credentials("Basic YWRtaW46czNjcmV0") == ("admin", "s3cret")
    assert basic_credentials("Bearer x") is None and basic_credentials("Basic !!") is None


def test_sparkline() -> None:
    assert sparkline_svg([1.0]) == ""
    svg = sparkline_svg([1.0, 3.0, 2.0], width=100, height=20, label="x<script>")
    assert svg.startswith("<svg") and "points=\"0.0,18.0 50.0,2.0 100.0,10.0\"" in svg and "<script>" not in svg


def test_shardjob_console_serves_a_registry(tmp_path: Path) -> None:
    """The command itself, as a process: it serves the API, shows the registry masked and
    keeps the password out of its output."""
    import socket

    from tests.waiting import wait_for

    with socket.socket() as probe:  # a free port for the child (released just before it binds)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "console.out"
    secret = "not-in-any-output"
    with out.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "console", "--registry", "memory://cli", "--listen", f"127.0.0.1:{port}"],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), "SHARDJOB_CONSOLE_PASSWORD": secret},
        )
    try:

        def answered() -> bool:
            try:
                return bool(httpx.get(f"http://127.0.0.1:{port}/api/jobs", timeout=2).json() == [])
            except httpx.HTTPError:
                return False

        wait_for(answered, 30, message=lambda: out.read_text())
        auth = ("admin", secret)
        assert httpx.post(f"http://127.0.0.1:{port}/api/jobs/x/trigger", auth=auth).status_code == 404
        assert "memory://cli" in httpx.get(f"http://127.0.0.1:{port}/").text
    finally:
        child.terminate()
        child.wait(15)
    assert secret not in out.read_text()


def test_the_job_page_lists_the_failover_queue() -> None:
    from scheduler import JobConfig
    from sharding.failover import FailoverEntry, FailoverQueue
    from sharding.layout import JobPaths

    reg = registry.connect(f"memory://pages-failover-{os.getpid()}")
    paths = JobPaths("settle")
    reg.put(paths.config, JobConfig(name="settle", sharding_total_count=3).to_json())
    queue = FailoverQueue((FailoverEntry(1_700_000_000.0, 2, "10.0.0.9@-@9"),))
    reg.put(paths.failover_items, queue.encode())
    with serve(reg) as served:
        page = httpx.get(f"{served.url}/jobs/settle").text
        table = page.split('<table id="failover">', 1)[1].split("</table>", 1)[0]
        assert "<td>2</td><td>2023-11-14 22:13:20</td><td>10.0.0.9@-@9</td>" in table
        assert 'data-item="2" data-owner="" data-status="FAILOVER"' in page
    reg.close()
