"""The dashboard in a real headless Chromium against a real server on the loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

import privsched as ps
from privsched.ledger.identities import Identities
from privsched.server.runner import Listen, http_api
from tests.support.dashboard import browser_missing, headless_chromium, populated_client, request

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")


@pytest.fixture
def served(tmp_db: Path):
    """``privsched serve``'s HTTP API on the loopback over a populated ledger, with an admin
    and a viewer; yields the URL, the database and the users' tokens."""
    populated_client(tmp_db).close()
    with Identities(tmp_db) as identities:
        tokens = {"admin": identities.add_user("admin", "admin"), "vera": identities.add_user("vera", "viewer")}
    with http_api(tmp_db, Listen("127.0.0.1", 0)) as bound:
        yield bound.url, tmp_db, tokens


@pytest.fixture
def browser(tmp_path: Path):
    driver = headless_chromium(tmp_path)
    yield driver
    driver.quit()


def wait_for(browser, condition, what: str):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
    return wait.until(condition, message=what)


def login(browser, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url + "/")
    wait_for(browser, lambda b: b.find_element(By.ID, "token").is_displayed(), "the login form")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()


def test_pages_show_blocks_queue_pipeline_and_follow_a_grant(served, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By

    url, db, tokens = served
    login(browser, url, tokens["admin"])
    rows = wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "tr.block"), "the block rows")
    keys = [row.find_element(By.TAG_NAME, "td").text for row in rows]
    assert sorted(keys) == ["d1", "d2", "d3", "r1"]
    fractions = {
        bucket: float(rows[keys.index("d1")].find_element(By.CSS_SELECTOR, f"span.{bucket}").get_attribute("data-fraction"))
        for bucket in ("consumed", "allocated", "unlocked")
    }
    assert fractions == pytest.approx({"consumed": 0.2, "allocated": 0.0, "unlocked": 0.8})
    browser.save_screenshot(str(tmp_path / "blocks.png"))

    browser.get(url + "/#queue")
    wait_for(browser, lambda b: "wait" in b.find_element(By.ID, "view").text, "the pending pipeline")
    text = browser.find_element(By.ID, "view").text
    assert "bo[/]" in text  # user text shown as text
    assert "budget: block d1 ε needs 0.9, unlocked 0.8" in text  # why it waits
    browser.save_screenshot(str(tmp_path / "queue.png"))

    # A grant made by somebody else shows up without a reload.
    with ps.connect(db, create=False) as client:
        late = client.ledger.submit(request("late", ["d3"], 0.05))
        client.ledger.grant([late])
    wait_for(
        browser,
        lambda b: "late" in b.find_element(By.XPATH, "//h2[starts-with(., 'Granted')]/following-sibling::table[1]").text,
        "the new grant on the queue page",
    )

    browser.find_element(By.LINK_TEXT, str(late)).click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "pipeline-state"), "the pipeline page")
    assert browser.find_element(By.ID, "pipeline-state").text == "granted"
    assert "0.05" in browser.find_element(By.ID, "view").text
    browser.save_screenshot(str(tmp_path / "pipeline.png"))

    browser.get(url + "/#audit")
    result = wait_for(browser, lambda b: b.find_elements(By.ID, "audit-result"), "the audit result")
    assert result[0].text.startswith("ok:")
    assert browser.find_element(By.ID, "chain-head").text.count(":") == 1


def test_a_viewer_reads_but_cannot_cancel(served, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By

    url, db, tokens = served
    with ps.connect(db, create=False) as client:
        waiting = next(p.id for p in client.list() if p.state == "pending")
    login(browser, url, tokens["vera"])
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "tr.block"), "the blocks page")
    browser.get(f"{url}/#pipeline/{waiting}")
    wait_for(browser, lambda b: b.find_elements(By.ID, "cancel"), "the cancel button")
    assert browser.find_element(By.ID, "log").text.startswith("(this job's log is not shown to you")
    assert browser.find_element(By.ID, "result").text == "What this code job released is shown to its submitter and admins only."
    browser.find_element(By.ID, "cancel").click()
    wait_for(browser, lambda b: "403" in b.find_element(By.ID, "cancel-result").text, "the refusal")
    browser.save_screenshot(str(tmp_path / "viewer-cancel.png"))
    with ps.connect(db, create=False) as client:
        assert client.status(waiting).state == "pending"


def test_a_wrong_token_gets_the_login_form_back(served, browser):
    from selenium.webdriver.common.by import By

    url, _, _ = served
    login(browser, url, token="wrong")
    wait_for(browser, lambda b: "401" in b.find_element(By.ID, "login-error").text, "the refusal")
    assert browser.find_element(By.ID, "view").text == ""


def test_the_queue_page_shows_a_full_storage_banner_while_it_lasts(served, browser):
    from selenium.webdriver.common.by import By

    from privsched.ledger.errors import StorageFull
    from privsched.service.rundirs import RunDirs
    from privsched.service.serve import Condition

    url, db, tokens = served
    runs = RunDirs(db)
    runs.root.mkdir(parents=True, exist_ok=True)  # as the scheduler makes it when it starts
    condition = Condition(runs, lambda message: None)
    condition.full(StorageFull("database or disk is full <b>[/]"))
    login(browser, url, tokens["vera"])
    browser.get(url + "/#queue")
    banner = wait_for(browser, lambda b: b.find_elements(By.ID, "condition"), "the banner")
    assert banner[0].text.startswith("scheduler: storage full since ")
    assert banner[0].text.endswith("database or disk is full <b>[/]; retrying")  # shown as text
    condition.clear()
    wait_for(browser, lambda b: not b.find_elements(By.ID, "condition"), "the banner to go")
    assert "Pending" in browser.find_element(By.ID, "view").text
