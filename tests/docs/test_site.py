"""The built documentation site (``make docs`` -> build/site), served on 127.0.0.1 and opened in headless
Chromium through Selenium: the home page renders (loading nothing from outside the site), the API
reference documents ``KinesisBroker.connect``, every chart of the benchmark page loads, and the
search finds "lease". Screenshots go to
build/docs-screenshots/ (a CI artifact, not committed).

Chromium and its driver are Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them);
Selenium is given the driver's path, so it never downloads one. Without them the tests skip, unless
``DOCS_BROWSER_REQUIRED=1`` (CI), where they fail.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
SHOTS = ROOT / "build" / "docs-screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
WAIT_S = 30.0

pytestmark = [pytest.mark.docs, pytest.mark.timeout(180)]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the stdlib names it format
        pass


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    """build/site (built with ``mkdocs build --strict`` first if ``make docs`` has not run) on 127.0.0.1."""
    if not (SITE / "index.html").exists():
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=ROOT, check=True, timeout=300)
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        if os.environ.get("DOCS_BROWSER_REQUIRED") == "1":
            pytest.fail("chromium and chromedriver are required (apt-get install chromium chromium-driver)")
        pytest.skip("no chromium/chromedriver on this machine")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, condition: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition)


def _offline(driver: Any, site_url: str) -> None:
    """Every resource the page loaded came from the site itself: no web font, no CDN."""
    names = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert names and all(n.startswith(site_url) for n in names), [n for n in names if not n.startswith(site_url)]


def test_the_home_page_renders(site_url: str, browser: Any) -> None:
    browser.get(f"{site_url}/index.html")
    h1 = _wait(browser, lambda d: d.find_element("css selector", "article h1"))
    assert h1.text == "kinesis_actors"
    assert "kinesis_actors" in browser.title
    nav = [a.get_attribute("textContent").strip() for a in browser.find_elements("css selector", "nav.md-nav a")]
    assert "Getting started" in nav and "API reference" in nav, nav
    _offline(browser, site_url)
    browser.save_screenshot(str(SHOTS / "home.png"))


def test_the_api_reference_documents_kinesis_broker_connect(site_url: str, browser: Any) -> None:
    browser.get(f"{site_url}/reference.html")
    heading = _wait(browser, lambda d: d.find_element("id", "kinesis_actors.KinesisBroker.connect"))
    assert "connect" in heading.get_attribute("textContent")
    doc = heading.find_element("xpath", "following-sibling::div[contains(@class, 'doc-contents')]")
    assert len(doc.get_attribute("textContent").strip()) > 100, "connect() has its docstring rendered"
    browser.save_screenshot(str(SHOTS / "reference.png"))


def test_every_chart_of_the_benchmark_page_loads(site_url: str, browser: Any) -> None:
    browser.get(f"{site_url}/benchmarks.html")
    images = _wait(browser, lambda d: d.find_elements("css selector", "article img[src*='assets/bench/']"))
    assert len(images) == 5, [i.get_attribute("src") for i in images]
    loaded = _wait(browser, lambda d: d.execute_script(
        "const imgs = [...document.querySelectorAll(\"article img[src*='assets/bench/']\")];"
        "return imgs.every(i => i.complete) ? imgs.map(i => [i.getAttribute('src'), i.naturalWidth]) : null;"))
    assert all(width > 0 for _, width in loaded), loaded
    _offline(browser, site_url)
    browser.save_screenshot(str(SHOTS / "benchmarks.png"))


def test_the_search_finds_lease(site_url: str, browser: Any) -> None:
    browser.get(f"{site_url}/index.html")
    box = _wait(browser, lambda d: d.find_element("css selector", "input.md-search__input"))
    if not box.is_displayed():  # a narrow window hides the box behind the search icon
        browser.find_element("css selector", "label[for='__search']").click()
    _wait(browser, lambda d: box.is_displayed())
    box.click()
    box.send_keys("lease")
    results = _wait(browser, lambda d: d.find_elements("css selector", "li.md-search-result__item") or None)
    titles = " ".join(r.get_attribute("textContent") for r in results).lower()
    assert "lease" in titles, titles[:500]
    browser.save_screenshot(str(SHOTS / "search.png"))
