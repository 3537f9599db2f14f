"""The viewer page in real headless Chromium: loading, navigation, filters, XSS, serving.

Every wait is a bounded WebDriverWait; the `browser` fixture skips when Chromium,
chromedriver or selenium is missing.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from starpo.viewer import build_viewer, serve

pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow  # drives a headless browser

TIMEOUT = 15


def open_page(browser, url: str) -> None:
    """Load `url` and wait until the page's script finished its first render."""
    browser.get(url)
    WebDriverWait(browser, TIMEOUT).until(
        lambda d: d.execute_script("return document.body.dataset.ready === '1'")
    )


def text(browser, element_id: str) -> str:
    return browser.find_element(By.ID, element_id).text


def wait_text(browser, element_id: str, expected: str) -> None:
    WebDriverWait(browser, TIMEOUT).until(lambda d: text(d, element_id) == expected)


def test_loads_from_file_and_shows_counts(browser, run_dir):
    open_page(browser, build_viewer(run_dir).as_uri())
    assert browser.title.startswith("starpo viewer")
    source = Select(browser.find_element(By.ID, "source"))
    assert [o.text for o in source.options] == [
        "train step 10 (3)",
        "train step 20 (2)",
        "val step 10 (1)",
    ]
    assert text(browser, "position") == "1 / 3"
    assert "3 episodes in train step 10" in text(browser, "source-note")
    assert "2 successful" in text(browser, "source-note")
    assert text(browser, "ep-seed") == "seed 1"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episode .turn")) == 1
    # No script error and no CSP violation (a wrong hash would also block the render).
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []


def test_navigation_changes_episode_and_step(browser, run_dir):
    open_page(browser, build_viewer(run_dir).as_uri())
    browser.find_element(By.ID, "next").click()
    wait_text(browser, "position", "2 / 3")
    assert text(browser, "ep-seed") == "seed 2"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episode .turn")) == 2
    browser.find_element(By.ID, "prev").click()
    browser.find_element(By.ID, "prev").click()  # wraps around to the last episode
    wait_text(browser, "position", "3 / 3")
    assert text(browser, "ep-env") == "env sokoban"
    Select(browser.find_element(By.ID, "source")).select_by_index(1)  # train step 20
    wait_text(browser, "position", "1 / 2")
    assert text(browser, "ep-seed") == "seed 1"
    assert text(browser, "turn-count") == "turns 4"


def test_filters(browser, run_dir):
    open_page(browser, build_viewer(run_dir).as_uri())
    Select(browser.find_element(By.ID, "outcome")).select_by_value("failure")
    wait_text(browser, "position", "1 / 1")
    assert text(browser, "ep-seed") == "seed 2" and text(browser, "ep-outcome") == "failure"
    Select(browser.find_element(By.ID, "outcome")).select_by_value("success")
    wait_text(browser, "position", "1 / 2")
    Select(browser.find_element(By.ID, "env")).select_by_value("sokoban")
    wait_text(browser, "position", "1 / 1")
    assert text(browser, "ep-env") == "env sokoban"
    Select(browser.find_element(By.ID, "outcome")).select_by_value("failure")
    wait_text(browser, "position", "0 / 0")
    assert "No episode matches" in text(browser, "episode")


def test_hostile_model_text_is_inert_and_verbatim(browser, run_dir, hostile_text):
    open_page(browser, build_viewer(run_dir).as_uri())
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    # Nothing the page builds is an <img> or <a>; data can only have made them.
    assert browser.find_elements(By.CSS_SELECTOR, "img, a, iframe, object, embed") == []
    assert len(browser.find_elements(By.TAG_NAME, "script")) == 2
    response = browser.find_element(By.CSS_SELECTOR, "#episode pre.response")
    shown = browser.execute_script("return arguments[0].textContent", response)
    assert hostile_text in shown
    state = browser.find_element(By.CSS_SELECTOR, "#episode pre.state")
    assert hostile_text in browser.execute_script("return arguments[0].textContent", state)
    # The same text in the seed columns and after navigation stays inert too.
    browser.find_element(By.CSS_SELECTOR, "button[data-tab=seeds]").click()
    WebDriverWait(browser, TIMEOUT).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#seed-columns .column")) == 2
    )
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert browser.find_elements(By.CSS_SELECTOR, "img, a") == []


def test_same_seed_columns_and_metric_charts(browser, run_dir, tmp_path):
    open_page(browser, build_viewer(run_dir).as_uri())
    browser.find_element(By.CSS_SELECTOR, "button[data-tab=seeds]").click()
    Select(browser.find_element(By.ID, "seed")).select_by_value("2")
    columns = browser.find_elements(By.CSS_SELECTOR, "#seed-columns .column")
    assert [c.find_element(By.TAG_NAME, "h3").text for c in columns] == [
        "train step 10",
        "train step 20",
    ]
    assert "failure" in columns[0].text and "success" in columns[1].text
    browser.find_element(By.CSS_SELECTOR, "button[data-tab=metrics]").click()
    charts = browser.find_elements(By.CSS_SELECTOR, "#charts svg")
    # success, entropy, grad_norm, in_group_std are on by default; other/thing is not.
    assert len(charts) == 4
    assert len(browser.find_elements(By.CSS_SELECTOR, "#charts .alert-mark")) == 4
    browser.find_element(By.CSS_SELECTOR, "#metric-picker input[value='other/thing']").click()
    WebDriverWait(browser, TIMEOUT).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#charts svg")) == 5
    )
    assert "entropy_drop" in text(browser, "alerts")
    shot = tmp_path / "metrics.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_folder_and_screenshot(browser, eval_dir, tmp_path):
    open_page(browser, build_viewer(eval_dir).as_uri())
    assert text(browser, "position") == "1 / 2"
    assert text(browser, "ep-policy") == "policy random"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episode .turn")) == 2
    assert "invalid: 1" in browser.find_elements(By.CSS_SELECTOR, "#episode .turn")[0].text
    browser.find_element(By.CSS_SELECTOR, "button[data-tab=summary]").click()
    assert '"success_rate": 0.5' in text(browser, "summary")
    shot = tmp_path / "eval.png"
    assert browser.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_on_localhost(browser, run_dir, tmp_path):
    page = build_viewer(run_dir)
    server, url = serve(page, port=0)
    try:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = reply.read().decode("utf-8")
            assert reply.status == 200
            assert "default-src 'none'" in reply.headers["Content-Security-Policy"]
        assert body == page.read_text(encoding="utf-8")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url + "metrics.jsonl", timeout=10)
        assert info.value.code == 404
        open_page(browser, url)
        assert text(browser, "position") == "1 / 3"
        shot = tmp_path / "served.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0
    finally:
        server.shutdown()
        server.server_close()


def test_skipped_lines_are_shown_on_the_page(browser, run_dir):
    open_page(browser, build_viewer(run_dir).as_uri())
    assert not browser.find_element(By.ID, "warnings").is_displayed()
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 21, "actor/ent')  # a run killed mid-write
    open_page(browser, build_viewer(run_dir).as_uri())
    banner = browser.find_element(By.ID, "warnings")
    assert banner.is_displayed() and "half-written last line" in banner.text
    assert "metrics.jsonl" in banner.text
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []


def test_turns_of_a_context_window_say_what_their_prompt_showed(browser, windowed_run_dir):
    open_page(browser, build_viewer(windowed_run_dir).as_uri())
    notes = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#episode .turn .window")]
    assert notes == ["prompt showed the task and turns 2-3"]


def test_tool_results_are_shown_verbatim_and_inert(browser, tool_run_dir, hostile_text):
    open_page(browser, build_viewer(tool_run_dir).as_uri())
    shown = browser.find_elements(By.CSS_SELECTOR, "#episode .turn pre.tool")
    texts = [browser.execute_script("return arguments[0].textContent", e) for e in shown]
    assert texts == [f'tool → {{"name": "{hostile_text}"}}', "tool → Error: unknown tool"]
    assert ["bad" in e.get_attribute("class") for e in shown] == [False, True]
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert browser.find_elements(By.CSS_SELECTOR, "img, a, iframe") == []
