"""The console over real registries without a browser (all three backends): its API is
``shardjob jobs/status --json`` exactly, its pages show what ``Cluster`` reports, and its
security holds — actions need the admin (401 without credentials, 403 for a guest), a form
POST needs its CSRF token, a stale configuration form is refused with the current values,
``--login-required`` closes the pages and the API."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from scheduler import Cluster, JobConfig, Scheduler, StaleConfig
from scheduler.cli import main
from scheduler.cluster_json import brief_json, detail_json, dump_json
from sharding.layout import JobPaths
from tests.console.kit import PASSWORD, Served, csrf_of, log_in, serve
from tests.harness import Harness
from tests.scheduler.cluster_kit import A, B, Runs, start
from tests.waiting import wait_for

JOB = "report"


@pytest.fixture
def served(harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster) -> Iterator[Served]:
    job = JobConfig(name=JOB, sharding_total_count=4, sharding_item_parameters="0=north,1=south", description="d")
    runs = Runs()
    start(harness, made, namespace, A, job, runs)
    start(harness, made, namespace, B, job, runs)
    wait_for(lambda: len(cluster.job(JOB).instances) == 2 and cluster.job(JOB).epoch is not None, 20)
    with serve(harness.connect(namespace)) as made_console:
        yield made_console


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_api_serves_what_the_cli_prints(
    served: Served, harness: Harness, namespace: str, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    url = harness.url(namespace)
    with httpx.Client(base_url=served.url) as web:
        wait_for(lambda: web.get("/api/jobs").json() == [brief_json(b) for b in cluster.jobs()], 10)
        wait_for(lambda: web.get(f"/api/jobs/{JOB}").json() == detail_json(cluster.job(JOB)), 10)
        assert web.get("/api/jobs").json() == cli_json(capsys, "jobs", "--registry", url)
        assert web.get(f"/api/jobs/{JOB}").json() == cli_json(capsys, "status", JOB, "--registry", url)
        missing = web.get("/api/jobs/nope")
        assert missing.status_code == 404 and "nope" in missing.json()["error"]

        # the pages show the same: every item's owner, state and parameter
        page = web.get(f"/jobs/{JOB}").text
        for item in cluster.job(JOB).items:
            assert f'data-item="{item.item}" data-owner="{item.instance}" data-status="{item.status.name}"' in page
        assert "north" in page and "south" in page
        jobs_page = web.get("/?status=OK").text
        assert f'data-job="{JOB}"' in jobs_page and "test-registry" in jobs_page
        assert f'data-job="{JOB}"' not in web.get("/?status=CRASHED&fragment=1").text
        assert web.get("/servers").status_code == 200


def test_api_actions_need_the_admin(served: Served, cluster: Cluster) -> None:
    anonymous = httpx.post(f"{served.url}/api/jobs/{JOB}/disable", json={"items": [1]})
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Basic")
    wrong = httpx.post(f"{served.url}/api/jobs/{JOB}/disable", json={"items": [1]}, auth=("admin", "wrong"))
    assert wrong.status_code == 401
    with httpx.Client(base_url=served.url) as guest:
        guest.get("/")  # a guest's session
        assert guest.post(f"/api/jobs/{JOB}/disable", json={"items": [1]}).status_code == 403
    assert cluster.job(JOB).items[1].status.name != "DISABLED"

    admin = ("admin", PASSWORD)
    done = httpx.post(f"{served.url}/api/jobs/{JOB}/disable", json={"items": [1]}, auth=admin)
    assert done.status_code == 200, done.text
    assert cluster.job(JOB).items[1].status.name == "DISABLED"
    assert httpx.post(f"{served.url}/api/jobs/{JOB}/enable", json={"items": [1]}, auth=admin).status_code == 200
    assert cluster.job(JOB).items[1].status.name != "DISABLED"
    assert httpx.post(f"{served.url}/api/jobs/{JOB}/disable", json={"server": "10.0.0.2"}, auth=admin).status_code == 200
    assert not next(i for i in cluster.job(JOB).instances if i.ip == "10.0.0.2").enabled
    triggered = httpx.post(f"{served.url}/api/jobs/{JOB}/trigger", auth=admin)
    assert triggered.status_code == 200 and "2 instance" in triggered.json()["message"]

    bad = httpx.post(f"{served.url}/api/jobs/{JOB}/disable", json={"items": "one"}, auth=admin)
    assert bad.status_code == 400 and "items" in bad.json()["error"]
    unknown = httpx.post(f"{served.url}/api/jobs/{JOB}/disable", json={"server": "10.9.9.9"}, auth=admin)
    assert unknown.status_code == 400 and "10.9.9.9" in unknown.json()["error"]
    assert httpx.post(f"{served.url}/api/jobs/nope/trigger", auth=admin).status_code == 404


def test_forms_need_the_admin_and_the_csrf_token(served: Served, cluster: Cluster) -> None:
    with httpx.Client(base_url=served.url) as web:
        token = csrf_of(web.get("/login").text)
        # a guest with a valid token still may not act
        refused = web.post(f"/jobs/{JOB}/action", data={"csrf": token, "action": "disable", "items": "2"})
        assert refused.status_code == 403
        assert log_in(web, "wrong").status_code == 401
        assert log_in(web).status_code == 303
        page = web.get(f"/jobs/{JOB}").text
        token = csrf_of(page)
        assert 'id="disable-item-2"' in page
        # a forged POST (no token, or another) is refused, even with the admin's cookie
        assert web.post(f"/jobs/{JOB}/action", data={"action": "disable", "items": "2"}).status_code == 403
        assert web.post(f"/jobs/{JOB}/action", data={"csrf": "x" + token, "action": "disable"}).status_code == 403
        assert cluster.job(JOB).items[2].status.name != "DISABLED"

        done = web.post(f"/jobs/{JOB}/action", data={"csrf": token, "action": "disable", "items": "2"}, follow_redirects=True)
        assert "disabled items 2" in done.text
        assert cluster.job(JOB).items[2].status.name == "DISABLED"
        oops = web.post(f"/jobs/{JOB}/action", data={"csrf": token, "action": "disable", "items": "x"}, follow_redirects=True)
        assert "refused" in oops.text and "whole numbers" in oops.text

        # a configuration edit from a stale form is refused, with the current values shown
        form = web.get(f"/jobs/{JOB}/config").text
        version = form.split('name="version" value="', 1)[1].split('"', 1)[0]
        saved = web.post(
            f"/jobs/{JOB}/config",
            data={"csrf": token, "version": version, "field_description": "first"},
            follow_redirects=True,
        )
        assert "configuration saved" in saved.text and cluster.config(JOB).description == "first"
        stale = web.post(f"/jobs/{JOB}/config", data={"csrf": token, "version": version, "field_description": "second"})
        assert stale.status_code == 409 and "changed since" in stale.text and 'value="first"' in stale.text
        assert cluster.config(JOB).description == "first"
        fresh = csrf_of(stale.text)
        new_version = stale.text.split('name="version" value="', 1)[1].split('"', 1)[0]
        invalid = web.post(
            f"/jobs/{JOB}/config", data={"csrf": fresh, "version": new_version, "field_sharding_total_count": "many"}
        )
        assert invalid.status_code == 400 and "sharding_total_count" in invalid.text

        # the session cookie is HttpOnly and SameSite=Strict
        cookie = web.get("/").headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie


def test_login_required_closes_pages_and_api(harness: Harness, namespace: str, cluster: Cluster) -> None:
    cluster.registry.put("/" + JOB + "/config", JobConfig(name=JOB).to_json())
    with serve(harness.connect(namespace), login_required=True) as served, httpx.Client(base_url=served.url) as web:
        assert web.get("/").status_code == 303
        assert web.get("/api/jobs").status_code == 401
        assert web.get("/api/jobs", auth=("admin", PASSWORD)).status_code == 200
        assert log_in(web).status_code == 303
        wait_for(lambda: JOB in web.get("/").text, 10)


def test_trigger_shutdown_and_remove_from_the_pages(served: Served, cluster: Cluster) -> None:
    with httpx.Client(base_url=served.url) as web:
        assert log_in(web).status_code == 303
        token = csrf_of(web.get(f"/jobs/{JOB}").text)

        def act(**fields: str) -> str:
            response = web.post(f"/jobs/{JOB}/action", data={"csrf": token, **fields}, follow_redirects=True)
            assert response.status_code == 200
            found = response.text.split('id="flash">', 1)[1].split("<", 1)[0]
            return found

        assert act(action="trigger") == f"job {JOB}: triggered on 2 instance(s)"
        assert act(action="shutdown", instance=B) == f"job {JOB}: asked {B} to shut down"
        wait_for(lambda: [i.id for i in cluster.job(JOB).instances] == [A], 20)
        refused = act(action="remove")
        assert "remove refused" in refused and "live instance" in refused and cluster.jobs()
        assert "unknown action" in act(action="explode")
        assert act(action="remove", force="1") == f"job {JOB}: removed"
        assert cluster.jobs() == []


def test_update_config_with_expected_version(served: Served, cluster: Cluster) -> None:
    """``Cluster.update_config(expected_version=...)``: the console's versioned edit."""
    config, version = cluster.config_version(JOB)
    cluster.update_config(JOB, expected_version=version, description="one")
    with pytest.raises(StaleConfig) as stale:
        cluster.update_config(JOB, expected_version=version, description="two")
    assert stale.value.current.description == "one" and stale.value.version == cluster.config_version(JOB)[1]
    assert cluster.config(JOB).description == "one"
    cluster.update_config(JOB, description="three")  # without it, the version read is the one written
    assert cluster.config(JOB).description == "three" and config.description == "d"


def test_a_job_dump_is_served_and_a_console_without_password_says_it_is_read_only(
    served: Served, harness: Harness, namespace: str, cluster: Cluster
) -> None:
    config = JobPaths(JOB).config
    with httpx.Client(base_url=served.url) as web:
        assert f'href="/jobs/{JOB}/dump"' in web.get(f"/jobs/{JOB}").text
        dumped = web.get(f"/jobs/{JOB}/dump")
        assert dumped.status_code == 200 and dumped.headers["content-type"].startswith("application/json")
        assert dumped.json()["nodes"][config] == dump_json(cluster.dump(JOB))["nodes"][config]
        assert web.get("/jobs/nope/dump").status_code == 404
        assert 'id="read-only"' not in web.get("/").text
    with serve(harness.connect(namespace), password=None) as read_only, httpx.Client(base_url=read_only.url) as web:
        page = web.get("/").text
        assert 'id="read-only"' in page and "Log in" not in page
        refused = web.post("/login", data={"csrf": csrf_of(web.get("/login").text), "user": "admin", "password": "x"})
        assert "read-only" in refused.text and 'id="whoami">guest' in refused.text
