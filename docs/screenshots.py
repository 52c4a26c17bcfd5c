"""Regenerate the README's dashboard screenshots from the demo's database.

    ./dev demo && .venv/bin/python docs/screenshots.py [--db runs/demo/privsched.db] [--out docs/images]

Works on a copy of the database and its run folders (an admin, a viewer and team ``research``'s quota of half of
every block of ``reviews`` are added to the copy only, so the teams page has a row), serves it
on the loopback as ``privsched serve --listen`` does, and photographs the blocks, pipelines,
queue, teams and one pipeline's pages as the admin, and the audit page as the viewer (refused),
in headless Chromium (Debian's ``chromium`` and ``chromium-driver``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from privsched import connect  # noqa: E402
from privsched.ledger.identities import Identities  # noqa: E402
from privsched.server.runner import Listen, http_api  # noqa: E402
from privsched.service.rundirs import RunDirs  # noqa: E402
from tests.support.dashboard import browser_missing, headless_chromium  # noqa: E402

#: The pages photographed, by file name, and whose token opens them.
PAGES = {
    "dashboard-blocks.png": ("#blocks", "admin"),
    "dashboard-pipelines.png": ("#pipelines", "admin"),
    "dashboard-pipeline.png": ("#pipeline/{model}", "admin"),
    "dashboard-queue.png": ("#queue", "admin"),
    "dashboard-teams.png": ("#teams", "admin"),
    "dashboard-refused.png": ("#audit", "viewer"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=REPO / "runs/demo/privsched.db")
    parser.add_argument("--out", type=Path, default=REPO / "docs/images")
    args = parser.parse_args()
    missing = browser_missing()
    if missing or not args.db.is_file():
        sys.exit(f"error: {missing or f'no database at {args.db} (run ./dev demo first)'}")
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "privsched.db"
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{args.db}{suffix}").exists():
                shutil.copy(f"{args.db}{suffix}", f"{copy}{suffix}")
        runs = RunDirs(args.db).root  # what the jobs released and left: the result column, the model
        if runs.is_dir():
            shutil.copytree(runs, RunDirs(copy).root)
        with Identities(copy) as identities:
            tokens = {"admin": identities.add_user("screenshots", "admin"), "viewer": identities.add_user("viewer", "viewer")}
        with connect(copy, create=False) as client:
            model = max(info.id for info in client.list(states=["completed"]) if info.job.get("kind") == "dpsgd")
            client.set_quota("reviews", "research", 0.5)
        browser = headless_chromium(Path(folder))
        try:
            with http_api(copy, Listen("127.0.0.1", 0)) as bound:
                browser.get(bound.url + "/")
                args.out.mkdir(parents=True, exist_ok=True)
                for name, (page, role) in PAGES.items():
                    browser.set_window_size(1280, 900)
                    browser.execute_script("sessionStorage.setItem('privsched-token', arguments[0])", tokens[role])
                    browser.get(f"{bound.url}/{page.format(model=model)}")
                    browser.refresh()  # start signed in
                    time.sleep(2.5)  # one poll of the page
                    height = browser.execute_script("return document.documentElement.scrollHeight")
                    browser.set_window_size(1280, max(600, height + 200))
                    time.sleep(0.5)
                    browser.save_screenshot(str(args.out / name))
                    print(args.out / name)
        finally:
            browser.quit()


if __name__ == "__main__":
    main()
