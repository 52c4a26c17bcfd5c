"""The redesigned dashboard's pages in a real headless Chromium against a real server on the
loopback, for each page and role: blocks as shares with the budget chart, every pipeline
through filters, search and pages, a pipeline in words, teams and quotas, a refused page,
and a result read and its model downloaded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import privsched as ps
from tests.support.dashboard import browser_missing, request
from tests.test_dashboard_browser import browser, login, served, wait_for  # noqa: F401
from tests.test_results import Served
from tests.test_results import served as results  # noqa: F401

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")

#: A date and time as every page prints them.
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def by():
    from selenium.webdriver.common.by import By

    return By


def view_text(browser) -> str:
    return browser.find_element(by().ID, "view").text


def shown_ids(browser) -> list[int]:
    return [int(a.text) for a in browser.find_elements(by().CSS_SELECTOR, "#pipelines-table a.pipeline-link")]


def test_the_blocks_page_shows_used_and_left_that_add_up_and_budget_over_time_with_axes_and_legend(served, browser):  # noqa: F811
    url, _, tokens = served
    login(browser, url, tokens["admin"])
    rows = wait_for(browser, lambda b: b.find_elements(by().CSS_SELECTOR, "tr.block"), "the block rows")
    cells = {row.find_element(by().TAG_NAME, "td").text: [td.text for td in row.find_elements(by().TAG_NAME, "td")] for row in rows}
    assert cells["d1"][3:6] == ["20.0 %", "80.0 %", "0.8"]  # used, left, ε left at δ_G
    assert cells["d2"][3:5] == ["30.0 %", "70.0 %"]
    chart = wait_for(browser, lambda b: b.find_elements(by().CSS_SELECTOR, ".history[data-dataset=stats] .uplot"), "the chart")[0]
    assert chart.find_element(by().CLASS_NAME, "u-title").text == "Budget over time: stats"
    legend = chart.find_element(by().CLASS_NAME, "u-legend").text
    assert "consumed" in legend and "given out (allocated + consumed)" in legend
    assert chart.find_elements(by().TAG_NAME, "canvas")  # the axes and lines are drawn


def test_every_page_runs_under_a_content_security_policy_of_self_alone(served, browser):  # noqa: F811
    url, db, tokens = served
    with ps.connect(db, create=False) as client:
        done = next(info.id for info in client.list() if info.name == "done")
    login(browser, url, tokens["admin"])
    wait_for(browser, lambda b: b.find_elements(by().CSS_SELECTOR, ".history .uplot"), "the chart")
    d1 = next(row for row in browser.find_elements(by().CSS_SELECTOR, "tr.block") if row.find_element(by().TAG_NAME, "td").text == "d1")
    width = d1.find_element(by().CSS_SELECTOR, "span.consumed").value_of_css_property("width")
    assert float(width.removesuffix("px")) > 0  # the bars' widths are set through the CSSOM, which the policy allows
    for page in ("#pipelines", "#queue", "#teams", "#audit", f"#pipeline/{done}"):
        browser.get(url + "/" + page)
        wait_for(browser, lambda b: b.find_element(by().ID, "view").text, f"the page {page}")
    violations = [entry["message"] for entry in browser.get_log("browser") if "Content Security Policy" in entry["message"]]
    assert violations == []


def test_every_pipeline_is_reached_through_the_pipelines_pages_and_its_links(served, browser):  # noqa: F811
    url, db, tokens = served
    with ps.connect(db, create=False) as client:
        for i in range(30):
            client.ledger.submit(request(f"extra-{i}", ["d2"], 0.01, owner="cy"))
        every = sorted((info.id for info in client.list()), reverse=True)
    login(browser, url, tokens["admin"])
    browser.get(url + "/#pipelines")
    wait_for(browser, lambda b: b.find_element(by().ID, "pipelines-count").text == "1–25 of 35, newest first", "the first page")
    first = shown_ids(browser)
    browser.find_element(by().ID, "page-older").click()
    wait_for(browser, lambda b: b.find_element(by().ID, "pipelines-count").text == "26–35 of 35, newest first", "the second page")
    assert first + shown_ids(browser) == every

    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(by().ID, "filter-state")).select_by_visible_text("completed")
    wait_for(browser, lambda b: b.find_element(by().ID, "pipelines-count").text.endswith("of 1, newest first"), "the state filter")
    row = browser.find_element(by().CSS_SELECTOR, "#pipelines-table tbody tr")
    assert "done" in row.text and "(no metrics)" in row.text and len(WHEN.findall(row.text)) == 2

    Select(browser.find_element(by().ID, "filter-state")).select_by_visible_text("every state")
    wait_for(browser, lambda b: "of 35" in b.find_element(by().ID, "pipelines-count").text, "the filter lifted")
    browser.find_element(by().ID, "filter-search").send_keys("bo[/]")
    browser.find_element(by().CSS_SELECTOR, "#filters button").click()
    wait_for(browser, lambda b: b.find_element(by().ID, "pipelines-count").text.startswith("1–1 of 1"), "the search")
    assert "wait" in browser.find_element(by().ID, "pipelines-table").text

    browser.find_element(by().LINK_TEXT, "d1").click()  # the block link
    selected = wait_for(browser, lambda b: b.find_elements(by().CSS_SELECTOR, "tr.block.selected"), "the block, selected")
    assert selected[0].find_element(by().TAG_NAME, "td").text == "d1"
    selected[0].find_element(by().LINK_TEXT, "pipelines").click()
    wait_for(browser, lambda b: b.find_element(by().ID, "pipelines-count").text.endswith("of 2, newest first"), "the block's pipelines")
    browser.find_elements(by().CSS_SELECTOR, "#pipelines-table a.pipeline-link")[0].click()
    wait_for(browser, lambda b: b.find_elements(by().ID, "pipeline-state"), "the pipeline page")
    assert browser.find_element(by().ID, "pipeline-state").text == "pending"


def test_a_viewer_finds_every_pipeline_but_not_what_a_code_job_released(served, browser):  # noqa: F811
    url, _, tokens = served
    login(browser, url, tokens["vera"])
    browser.get(url + "/#pipelines?state=completed")
    wait_for(browser, lambda b: b.find_element(by().ID, "pipelines-count").text == "1–1 of 1, newest first", "the completed pipeline")
    row = browser.find_element(by().CSS_SELECTOR, "#pipelines-table tbody tr").text
    assert "done" in row and row.endswith("(shown to its submitter and admins)")


def test_a_pipeline_page_reads_in_words_and_tables_with_dates(served, browser):  # noqa: F811
    url, db, tokens = served
    with ps.connect(db, create=False) as client:
        done = next(info.id for info in client.list() if info.name == "done")
        running = next(info.id for info in client.list() if info.name == "busy")
    login(browser, url, tokens["admin"])
    browser.get(f"{url}/#pipeline/{done}")
    wait_for(browser, lambda b: b.find_elements(by().ID, "demands"), "the pipeline page")
    text = view_text(browser)
    assert "{" not in text and "}" not in text  # no raw JSON
    assert browser.find_element(by().ID, "summary").text.startswith("completed — done completed (since 1970-01-01 00:00:12 UTC)")
    assert [r.text for r in browser.find_elements(by().CSS_SELECTOR, "#timeline tbody tr")][0] == "submitted 1970-01-01 00:00:01 UTC"
    demand = browser.find_element(by().CSS_SELECTOR, "#demands tbody tr").text
    assert demand == "d1 ε = 0.4 → 40.0 % of block d1 80.0 % ε = 0.2 → 20.0 %"
    assert browser.find_element(by().ID, "result").text.startswith("Charged ε = 0.2 at δ_G = 0.000001")
    browser.get(f"{url}/#pipeline/{running}")
    wait_for(browser, lambda b: b.find_element(by().ID, "placement").text == "Placement: cpus 1; gpus 0", "the placement in words")


def test_the_teams_page_shows_each_teams_quota(served, browser):  # noqa: F811
    url, db, tokens = served
    with ps.connect(db, create=False) as client:
        client.set_quota("stats", "blue", 0.25)
    login(browser, url, tokens["vera"])
    browser.get(url + "/#teams")
    table = wait_for(browser, lambda b: b.find_elements(by().ID, "teams-stats"), "the teams table")[0]
    assert table.find_element(by().CSS_SELECTOR, "tbody tr").text == "blue 25.0 % 0.0 % 0.0 % 0"


def test_a_viewer_opening_the_audit_gets_a_page_that_says_so(served, browser):  # noqa: F811
    url, _, tokens = served
    login(browser, url, tokens["vera"])
    wait_for(browser, lambda b: b.find_elements(by().CSS_SELECTOR, "tr.block"), "the blocks page")
    browser.find_element(by().ID, "nav-audit").click()
    refused = wait_for(browser, lambda b: b.find_elements(by().ID, "refused"), "the refusal page")[0]
    assert refused.get_attribute("data-status") == "403"
    assert refused.find_element(by().TAG_NAME, "h2").text == "Not allowed (403)"
    assert browser.find_element(by().ID, "refused-message").text == "only an admin may audit the ledger (you are vera, viewer)"
    assert not browser.find_elements(by().CSS_SELECTOR, "tr.block")  # not the previous page


@pytest.mark.slow
def test_a_submitter_downloads_its_model_and_a_viewer_reads_its_metrics_but_not_a_code_jobs(results: Served, browser, tmp_path: Path):  # noqa: F811
    import torch

    from privsched.trainers.models import build_model

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    login(browser, results.url, results.tokens["alice"])
    browser.get(f"{results.url}/#pipeline/{results.ids['model']}")
    metrics = wait_for(browser, lambda b: b.find_elements(by().ID, "metrics"), "the model's metrics")[0].text
    assert "architecture.name logreg" in metrics
    browser.find_element(by().CSS_SELECTOR, "button.download[data-name='model.pt']").click()
    wait_for(browser, lambda b: (downloads / "model.pt").is_file(), "the downloaded model")
    wait_for(browser, lambda b: "downloaded model.pt" in b.find_element(by().ID, "download-status").text, "the download's end")
    with ps.connect(results.db, create=False) as client:
        architecture = client.result(results.ids["model"]).metrics["architecture"]
    build_model(**architecture).load_state_dict(torch.load(downloads / "model.pt", weights_only=True))

    browser.execute_script("sessionStorage.setItem('privsched-token', arguments[0])", results.tokens["vera"])
    browser.get(f"{results.url}/#pipeline/{results.ids['code']}")
    browser.refresh()
    withheld = wait_for(browser, lambda b: b.find_elements(by().CSS_SELECTOR, "#result.withheld"), "the withheld result")[0]
    assert withheld.text == "What this code job released is shown to its submitter and admins only."
    browser.get(f"{results.url}/#pipeline/{results.ids['model']}")
    wait_for(browser, lambda b: "architecture.name logreg" in b.find_element(by().ID, "metrics").text, "a built-in job's metrics")
