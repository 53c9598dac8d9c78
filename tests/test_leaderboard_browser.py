"""The generated index.html in headless Chromium: table and figures render, headers sort.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package (CI installs
them); skips with the reason when one is missing. The screenshot is written to
``$BT_BENCH_SCREENSHOT_DIR`` when set (else the test's temp folder) so a person can look at it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from benchmark.leaderboard import generate
from tests.test_leaderboard import standard_submissions

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _driver(profile: Path):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium; it is a test extra)")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium chromium-driver)")
    if CHROMEDRIVER is None:
        pytest.skip("chromedriver is not installed (apt-get install chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1800",
                f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _names(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "table#leaderboard-tiny tbody tr")
    return [r.get_attribute("data-name") for r in rows]


def test_page_renders_and_sorts_on_header_click(tmp_path):
    from_env = os.environ.get("BT_BENCH_SCREENSHOT_DIR")
    shots = Path(from_env) if from_env else tmp_path
    subs = standard_submissions(tmp_path / "submissions")
    out = tmp_path / "leaderboard"
    generate(subs, out)
    driver = _driver(tmp_path / "profile")
    try:
        from selenium.webdriver.common.by import By

        driver.get((out / "index.html").resolve().as_uri())
        assert driver.title == "bt-bench leaderboard"
        # the table and every figure rendered (an image that failed to load has naturalWidth 0)
        assert _names(driver) == ["alpha", "beta", "delta", "gamma", "random"]
        images = driver.find_elements(By.TAG_NAME, "img")
        assert len(images) == 2
        for img in images:
            assert driver.execute_script("return arguments[0].complete && "
                                         "arguments[0].naturalWidth", img) > 100
        shots.mkdir(parents=True, exist_ok=True)
        shot = shots / "leaderboard.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000

        head = driver.find_element(By.CSS_SELECTOR,
                                   "table#leaderboard-tiny th[data-key='draw_auc']")
        head.click()  # numeric metric: best first; gamma scores no draws and goes last
        assert _names(driver) == ["alpha", "beta", "delta", "random", "gamma"]
        assert head.get_attribute("aria-sort") == "descending"
        head.click()  # a second click reverses; rows without a value stay last
        assert _names(driver) == ["random", "delta", "beta", "alpha", "gamma"]
        assert head.get_attribute("aria-sort") == "ascending"
        name = driver.find_element(By.CSS_SELECTOR, "table#leaderboard-tiny th[data-key='name']")
        name.click()  # text: alphabetical first
        assert _names(driver) == ["alpha", "beta", "delta", "gamma", "random"]
        name.click()
        assert _names(driver) == ["random", "gamma", "delta", "beta", "alpha"]
        driver.find_element(By.CSS_SELECTOR, "table#leaderboard-tiny th[data-key='rank']").click()
        assert _names(driver) == ["alpha", "beta", "delta", "gamma", "random"]
        driver.save_screenshot(str(shots / "leaderboard_sorted.png"))
    finally:
        driver.quit()
