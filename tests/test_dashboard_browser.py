"""The dashboard in a real headless Chromium against a real server on the loopback."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Header, HTTPException

import privsched as ps
from privsched.dashboard.routes import dashboard_router
from tests.support.dashboard import browser_missing, headless_chromium, populated_client, request

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")
TOKEN = "viewer-token"


@pytest.fixture
def served(tmp_db: Path):
    populated_client(tmp_db).close()
    local = threading.local()

    def client():
        if not hasattr(local, "client"):
            local.client = ps.connect(tmp_db, create=False)
        return local.client

    def viewer(authorization: str = Header("")) -> None:
        if authorization != f"Bearer {TOKEN}":
            raise HTTPException(401, "a valid token is required")

    app = FastAPI()
    app.include_router(dashboard_router(client, viewer))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", tmp_db
    server.should_exit = True
    thread.join()


@pytest.fixture
def browser(tmp_path: Path):
    driver = headless_chromium(tmp_path)
    yield driver
    driver.quit()


def wait_for(browser, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, 20, poll_frequency=0.1).until(condition, message=what)


def login(browser, url: str, token: str = TOKEN) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url + "/")
    wait_for(browser, lambda b: b.find_element(By.ID, "token").is_displayed(), "the login form")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()


def test_pages_show_blocks_queue_pipeline_and_follow_a_grant(served, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By

    url, db = served
    login(browser, url)
    rows = wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "tr.block"), "the block rows")
    keys = [row.find_element(By.TAG_NAME, "td").text for row in rows]
    assert sorted(keys) == ["d1", "d2", "d3", "r1"]
    fractions = {bucket: float(rows[keys.index("d1")].find_element(By.CSS_SELECTOR, f"span.{bucket}").get_attribute("data-fraction"))
                 for bucket in ("consumed", "allocated", "unlocked")}
    assert fractions == pytest.approx({"consumed": 0.2, "allocated": 0.0, "unlocked": 0.8})
    browser.save_screenshot(str(tmp_path / "blocks.png"))

    browser.get(url + "/#queue")
    wait_for(browser, lambda b: "wait" in b.find_element(By.ID, "view").text, "the pending pipeline")
    assert "bo[/]" in browser.find_element(By.ID, "view").text  # user text shown as text
    browser.save_screenshot(str(tmp_path / "queue.png"))

    # A grant made by somebody else shows up without a reload.
    with ps.connect(db, create=False) as client:
        late = client.ledger.submit(request("late", ["d3"], 0.05))
        client.ledger.grant([late])
    wait_for(browser, lambda b: "late" in b.find_element(By.XPATH, "//h2[starts-with(., 'Granted')]/following-sibling::table[1]").text,
             "the new grant on the queue page")

    browser.find_element(By.LINK_TEXT, str(late)).click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "pipeline-state"), "the pipeline page")
    assert browser.find_element(By.ID, "pipeline-state").text == "granted"
    assert "0.05" in browser.find_element(By.ID, "view").text
    browser.save_screenshot(str(tmp_path / "pipeline.png"))

    browser.get(url + "/#audit")
    result = wait_for(browser, lambda b: b.find_elements(By.ID, "audit-result"), "the audit result")
    assert result[0].text.startswith("ok:")


def test_a_wrong_token_gets_the_login_form_back(served, browser):
    from selenium.webdriver.common.by import By

    url, _ = served
    login(browser, url, token="wrong")
    wait_for(browser, lambda b: "401" in b.find_element(By.ID, "login-error").text, "the refusal")
    assert browser.find_element(By.ID, "view").text == ""
