"""Headless Chromium for the console's browser tests: Debian's ``chromium`` driven through
Debian's ``chromium-driver`` at ``/usr/bin/chromedriver`` — nothing is downloaded at test
time (Selenium Manager is never asked: the driver's path is given).

Invariant: every browser is started with a fresh profile directory and quit by its owner.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

__all__ = ["CHROMEDRIVER", "CHROMIUM", "FLAGS", "chromium", "screenshot_dir"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: no sandbox (root in a container), no GPU, no background traffic, no first-run UI
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
)
#: where screenshots go (else the test's tmp directory)
SCREENSHOTS_ENV = "SHARDJOB_SCREENSHOTS"


def chromium(profile: Path) -> WebDriver:
    """A headless Chromium with ``profile`` as its (fresh) user data directory."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"no {', '.join(missing)}: apt-get install chromium chromium-driver (./scripts/test does)", pytrace=False
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def screenshot_dir(fallback: Path) -> Path:
    chosen = os.environ.get(SCREENSHOTS_ENV)
    directory = Path(chosen) if chosen else fallback
    directory.mkdir(parents=True, exist_ok=True)
    return directory
