"""The console in headless Chromium over real ``shardjob worker`` processes on ZooKeeper
and etcd: the pages show what ``Cluster`` reports; a guest cannot act and a forged POST is
refused (403); the admin disables an item from the page and its runs stop; a SIGKILLed
worker's items move on the page while it refreshes itself. Screenshots of every page are
saved ($SHARDJOB_SCREENSHOTS, else the test's tmp directory).

Few and fast by design (one scenario per backend, marked ``browser``): each wait is a
bounded wait on a condition.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from scheduler import Cluster
from tests.console.browser import chromium, screenshot_dir
from tests.console.kit import PASSWORD, serve
from tests.harness import Harness
from tests.scenarios.workers import Fleet
from tests.waiting import wait_for

pytestmark = pytest.mark.browser

SESSION_TIMEOUT = 2
#: how long past the session timeout the registry may take to expire a killed worker
EXPIRY_SLACK = 3.0
TOTAL = 4
JOB = "job"
W1, W2 = "10.0.0.1@-@1", "10.0.0.2@-@2"

#: every item row of the job page at once (one script: no row goes stale mid-read)
ITEM_ROWS = (
    "return Array.from(document.querySelectorAll('#items tbody tr'))"
    ".map(function (r) { return [Number(r.dataset.item), r.dataset.owner, r.dataset.status]; });"
)
#: an element's text, or null when there is none
TEXT_OF = "var e = document.querySelector(arguments[0]); return e ? e.innerText : null;"
#: the servers listed on the servers page
SERVER_ROWS = (
    "return Array.from(document.querySelectorAll('#servers tbody tr')).map(function (r) { return r.dataset.server; });"
)
#: POST from the page with the browser's cookies and no CSRF token; the callback gets the status
FORGED_POST = (
    "var done = arguments[arguments.length - 1];"
    "fetch(arguments[0], {method: 'POST', credentials: 'same-origin',"
    " headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: arguments[1]})"
    ".then(function (r) { done(r.status); }, function (e) { done(String(e)); });"
)


@pytest.fixture
def namespace(server: Harness) -> str:
    return server.fresh_namespace()


@pytest.fixture
def history_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def fleet(server: Harness, namespace: str, tmp_path: Path, history_url: str) -> Iterator[Fleet]:
    made = Fleet(
        server.url(namespace, session_timeout=SESSION_TIMEOUT),
        tmp_path,
        job=JOB,
        total=TOTAL,
        hold=0.2,
        extra_args=["--history", history_url, "--item-parameters", "0=north,1=south,2=east,3=west"],
    )
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def cluster(server: Harness, namespace: str) -> Iterator[Cluster]:
    with Cluster(server.url(namespace)) as made:
        yield made


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    driver = chromium(tmp_path / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()


def text_of(browser: WebDriver, selector: str) -> str:
    """The element's text, read in one script: the live part of a page is replaced every
    refresh, so an element found by one call may be gone (stale) by the next."""
    found = browser.execute_script(TEXT_OF, selector)
    return "" if found is None else str(found)


def click(browser: WebDriver, selector: str, timeout: float = 10) -> None:
    """Click the element, found afresh until a click lands (see ``text_of``)."""

    def attempt() -> bool:
        try:
            browser.find_element(By.CSS_SELECTOR, selector).click()
        except (StaleElementReferenceException, NoSuchElementException):
            return False
        return True

    wait_for(attempt, timeout, interval=0.05, message=f"no clickable {selector}")


def page_items(browser: WebDriver) -> list[tuple[int, str, str]]:
    rows: list[list[Any]] = browser.execute_script(ITEM_ROWS)
    return [(int(item), str(owner), str(status)) for item, owner, status in rows]


def cluster_items(cluster: Cluster) -> list[tuple[int, str, str]]:
    return [(v.item, v.instance or "", v.status.name) for v in cluster.job(JOB).items]


def owners(items: list[tuple[int, str, str]]) -> dict[int, str]:
    return {item: owner for item, owner, _ in items}


def test_the_console_in_a_browser_over_worker_processes(
    server: Harness,
    namespace: str,
    fleet: Fleet,
    cluster: Cluster,
    browser: WebDriver,
    history_url: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    backend = request.node.callspec.params["server"]
    shots = screenshot_dir(tmp_path / "screenshots")

    def shot(page: str) -> None:
        height = int(browser.execute_script("return document.documentElement.scrollHeight"))
        browser.set_window_size(1280, max(600, min(height + 140, 2400)))  # the whole page
        browser.save_screenshot(str(shots / f"{backend}-{page}.png"))
        browser.set_window_size(1280, 1000)

    fleet.start(W1, W2)
    wait_for(lambda: set(owners(cluster_items(cluster)).values()) == {W1, W2}, 20)
    with serve(server.connect(namespace), history_url=history_url) as served:
        base = served.url
        # the job list shows what Cluster reports
        browser.get(base + "/")
        [brief] = cluster.jobs()
        row = text_of(browser, f'#jobs tr[data-job="{JOB}"]')
        assert brief.status.name in row and str(brief.sharding_total_count) in row
        shot("jobs")

        # the job page too: every item's owner (states change with each fire: owners do not)
        browser.get(f"{base}/jobs/{JOB}")
        wait_for(lambda: owners(page_items(browser)) == owners(cluster_items(cluster)), 10)
        assert "south" in text_of(browser, "#items")
        assert text_of(browser, "#leader") == cluster.job(JOB).leader

        # a guest sees no action and cannot act, even by a forged POST
        assert not browser.find_elements(By.ID, "trigger") and not browser.find_elements(By.CSS_SELECTOR, ".item-disable")
        forged = browser.execute_async_script(FORGED_POST, f"/jobs/{JOB}/action", "action=disable&items=1")
        assert forged == 403
        as_guest = browser.execute_async_script(FORGED_POST, f"/api/jobs/{JOB}/disable", "")
        assert as_guest == 403

        browser.get(f"{base}/login?next=/jobs/{JOB}")
        shot("login")
        browser.find_element(By.ID, "password").send_keys(PASSWORD)
        browser.find_element(By.ID, "login").click()
        wait_for(lambda: "logged in as admin" in text_of(browser, "body"), 10)
        # a forged POST carries the admin's cookie but not the token: refused all the same
        forged = browser.execute_async_script(FORGED_POST, f"/jobs/{JOB}/action", "action=disable&items=1")
        assert forged == 403
        assert cluster.job(JOB).items[1].status.name != "DISABLED"

        # the admin disables item 1 from the page (after confirming): its runs stop
        click(browser, "#disable-item-1")
        WebDriverWait(browser, 5).until(expected_conditions.alert_is_present()).accept()
        wait_for(lambda: "disabled items 1" in text_of(browser, "body"), 10)
        disabled_at = time.time()
        assert cluster.job(JOB).items[1].status.name == "DISABLED"
        wait_for(lambda: dict((i, s) for i, _, s in page_items(browser))[1] == "DISABLED", 10)
        wait_for(lambda: len({r.fire_time for r in fleet.records() if r.fire_time > disabled_at + 1}) >= 3, 20)
        late = [r for r in fleet.records() if r.fire_time > disabled_at + 1]
        assert {r.item for r in late} == {0, 2, 3}, late
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "svg.spark"), 15, message="no sparkline drawn")
        shot("job")

        # a SIGKILLed worker's items move on the page, which refreshes by itself
        fleet.worker(W2).kill()
        wait_for(
            lambda: set(owners(page_items(browser)).values()) == {W1},
            SESSION_TIMEOUT + EXPIRY_SLACK + 15,
            message=lambda: f"page {page_items(browser)}, cluster {cluster_items(cluster)}",
        )
        assert owners(page_items(browser)) == owners(cluster_items(cluster))
        assert [i.id for i in cluster.job(JOB).instances] == [W1]
        shot("job-after-failover")

        browser.get(base + "/servers")
        assert browser.execute_script(SERVER_ROWS) == [s.ip for s in cluster.servers()]
        shot("servers")
        browser.get(f"{base}/history?job={JOB}&item=0")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#history tbody tr td a"), 10)
        shot("history")
        browser.get(f"{base}/jobs/{JOB}/config")
        assert browser.find_element(By.ID, "field_cron").get_attribute("value") == cluster.config(JOB).cron
        shot("config")
