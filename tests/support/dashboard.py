"""A ledger in every pipeline state, for the dashboard's views, metrics and pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import privsched as ps
from privsched.client import Client
from privsched.ledger import BlockSpec, PipelineRequest


def request(name: str, keys: list[str], epsilon: float, owner: str = "ana") -> PipelineRequest:
    return PipelineRequest(name, "stats", keys, demand=np.array([epsilon, 1e-7]), owner=owner)


def populated_client(path: Path) -> Client:
    """Dataset ``stats`` (basic, ε_G = 1, δ_G = 1e-6) with blocks d1–d3 fully unlocked and one
    pipeline of each kind: ``done`` completed on d1 having spent half its ε = 0.4 grant,
    ``busy`` running on d2 (ε 0.3), ``ready`` granted on d3 (ε 0.2), ``stop`` cancelled, and
    ``wait`` pending (ε 0.9 on d1, where only 0.8 is left). Dataset ``reviews`` (RDP) has one
    untouched block."""
    client = ps.connect(path)
    ledger = client.ledger
    ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic", now=0)
    ledger.add_blocks("stats", [BlockSpec(f"d{i}") for i in (1, 2, 3)], unlocked_fraction=1.0, now=0)
    ledger.create_dataset("reviews", 10.0, 1e-7, now=0)
    ledger.add_blocks("reviews", ["r1"], now=0)
    done, busy, ready, stop = (
        ledger.submit(request(name, [key], eps), now=t)
        for t, (name, key, eps) in enumerate([("done", "d1", 0.4), ("busy", "d2", 0.3), ("ready", "d3", 0.2), ("stop", "d3", 0.1)], start=1)
    )
    ledger.grant([done, busy, ready], now=10)
    ledger.mark_running(done, {"cpus": 1}, now=11)
    ledger.complete(done, {"d1": np.array([0.2, 5e-8])}, now=12)
    ledger.mark_running(busy, {"cpus": 1, "gpus": ["0"]}, now=13)
    ledger.cancel(stop, now=14)
    ledger.submit(request("wait", ["d1"], 0.9, owner="bo[/]<b>"), now=15)
    return client


BROWSER = Path("/usr/bin/chromium")
DRIVER = Path("/usr/bin/chromedriver")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (./dev env installs it)"
    for path, package in ((BROWSER, "chromium"), (DRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is missing (install the Debian package {package}; .ci/run does)"
    return None


def headless_chromium(download_dir: Path):
    """A real headless Chromium driven by Selenium, with the flags this machine's closed
    network needs (no background connections, a fresh profile)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(BROWSER)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
        f"--user-data-dir={download_dir / 'profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for CSP violations
    return webdriver.Chrome(service=Service(str(DRIVER)), options=options)
