"""The generated index.html in headless Chromium: it fits a 1,400 px window, figures load,
headers sort the ranked rows (the reference rows stay put), fallbacks are marked, the pairwise
matrices show the leaderboard's verdicts.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package (CI installs
them); skips with the reason when one is missing. The screenshots are written to
``$BT_BENCH_SCREENSHOT_DIR`` when set (else the test's temp folder) so a person can look at them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from benchmark.leaderboard import generate
from tests.test_leaderboard import REFERENCE_ROWS, standard_submissions

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WIDTH = 1400


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
                "--disable-dev-shm-usage", f"--window-size={WIDTH},1800",
                f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _names(driver, table: str, body: str = "ranked") -> list[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f"table#{table} tbody.{body} tr")
    return [r.get_attribute("data-name") for r in rows]


def _order(rows: list[dict], key: str, reverse: bool) -> list[str]:
    """The order the page's sort gives: by value (stable: ties keep the ranked order), empty
    values last."""
    have = [r for r in rows if r[key] is not None]
    return ([r["name"] for r in sorted(have, key=lambda r: r[key], reverse=reverse)]
            + [r["name"] for r in rows if r[key] is None])


def test_page_fits_sorts_and_shows_figures(tmp_path):
    from_env = os.environ.get("BT_BENCH_SCREENSHOT_DIR")
    shots = Path(from_env) if from_env else tmp_path
    subs = standard_submissions(tmp_path / "submissions")
    (subs / "_reference").mkdir()
    (subs / "_reference" / "paper_rows.json").write_text(json.dumps(REFERENCE_ROWS))
    out = tmp_path / "leaderboard"
    generate(subs, out)
    data = json.loads((out / "leaderboard.json").read_text())
    rel = data["releases"][0]
    driver = _driver(tmp_path / "profile")
    try:
        from selenium.webdriver.common.by import By

        driver.get((out / "index.html").resolve().as_uri())
        assert driver.title == "bt-bench leaderboard"

        # every table fits the window: no horizontal scrolling, on the page or in a table's box,
        # and the last column (the verdict) ends inside the viewport
        page = driver.execute_script("var e=document.documentElement;"
                                     "return [e.scrollWidth, e.clientWidth, window.innerWidth]")
        assert page[2] == WIDTH and page[0] <= page[1], page
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll('div.scroll')).map(function(d){"
            "var t=d.querySelector('table');return [t.id, d.scrollWidth, d.clientWidth,"
            "t.tHead.rows[0].lastElementChild.getBoundingClientRect().right];})")
        # suite and two tasks, two tracks each, each with its pairwise matrix; the paper's
        assert len(boxes) == 2 * (2 + 2 * 2) + 1
        for table_id, scroll, client, right in boxes:
            assert scroll <= client and right <= page[1], (table_id, scroll, client, right)

        # the figures load (an image that failed to load has naturalWidth 0)
        images = driver.find_elements(By.TAG_NAME, "img")
        expected = [p for t in rel["tasks"] for tb in t["tracks"] for p in tb["figures"].values()]
        assert sorted(i.get_attribute("src").split("/leaderboard/")[1] for i in images) == \
            sorted(expected)
        for img in images:
            assert driver.execute_script("return arguments[0].complete && "
                                         "arguments[0].naturalWidth", img) > 100

        shots.mkdir(parents=True, exist_ok=True)
        shot = shots / "leaderboard.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000

        # headers sort the ranked rows; the reference rows stay on top and at the bottom
        table = "task-tiny-vkwjp-gradient"
        rows = rel["tasks"][1]["tracks"][0]["rows"]
        ranked = [r["name"] for r in rows]
        assert _names(driver, table) == ranked
        head = driver.find_element(By.CSS_SELECTOR, f"table#{table} th[data-key='draw_auc']")
        head.click()  # numeric metric: best first
        assert _names(driver, table) == _order(rows, "draw_auc", reverse=True)
        assert _names(driver, table) != ranked
        assert head.get_attribute("aria-sort") == "descending"
        head.click()  # a second click reverses
        assert _names(driver, table) == _order(rows, "draw_auc", reverse=False)
        assert head.get_attribute("aria-sort") == "ascending"
        assert _names(driver, table, "ref-top") == ["oracle", "provenance"]
        assert _names(driver, table, "ref-bottom") == ["random"]
        name = driver.find_element(By.CSS_SELECTOR, f"table#{table} th[data-key='name']")
        name.click()  # text: alphabetical first
        assert _names(driver, table) == sorted(ranked)
        name.click()
        assert _names(driver, table) == sorted(ranked, reverse=True)
        driver.find_element(By.CSS_SELECTOR, f"table#{table} th[data-key='rank']").click()
        assert _names(driver, table) == ranked

        # the pairwise matrix: row vs column marks as leaderboard.json says, differences in
        # the tooltips
        pw = rel["tasks"][1]["tracks"][0]["pairwise"]
        marks = {"better": "\u25b2", "worse": "\u25bc", "tie": "\u00b7"}
        for i, a in enumerate(ranked):
            cells = driver.find_elements(By.CSS_SELECTOR, f"table#pairs-{table} "
                                                          f"tr[data-name='{a}'] td")[2:]
            assert [c.text for c in cells] == [marks[pw[a][b]["verdict"]] if b != a else ""
                                               for b in ranked]
            assert cells[(i + 1) % len(ranked)].get_attribute("title").startswith(f"{a} - ")

        # the open track's step-level number of an entry that falls back is marked as such
        cell = driver.find_element(
            By.CSS_SELECTOR, "table#task-tiny-qzxbt-open tr[data-name='trigger-text'] "
                             "td.fallback")
        assert cell.text.endswith("\u2020") and "sketch method" in cell.get_attribute("title")

        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(WIDTH, min(height + 100, 16_000))
        driver.save_screenshot(str(shots / "leaderboard_full.png"))
    finally:
        driver.quit()
