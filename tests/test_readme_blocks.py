"""The README runs as written: every fenced ``bash`` block and Python example is run, section
by section, each section in a fresh folder, its blocks in order, with ``privsched`` as
``python -m privsched`` from this checkout. Fixtures stand in for the README's placeholders
(a file a block names, a running server, a token); each is listed below with what it stands
for. Blocks that cannot run in a test are listed with the reason, never skipped silently,
and a block that is neither run nor listed fails the test."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from privsched.spec import load_spec
from tests.conftest import REPO

README = REPO / "README.md"

#: Blocks that cannot run in a test, by their section and first line, with the reason.
NOT_RUNNABLE = {
    ("Quick start", "./dev demo"): "creates .venv and installs every dependency; the demo is tests/test_demo.py",
    ("Pipelines and the scheduler", "privsched submit pipeline.yaml"): (
        "a reference of each command's options: `serve` and `logs --follow` run until interrupted and 7 is "
        "the reader's pipeline; each command runs in the blocks below and in tests/test_cli_*.py"
    ),
    ("Pipelines and the scheduler", 'run = client.run(7); run.download("model/")'): (
        "a fragment on the reader's completed DP-SGD pipeline 7 and `client`; tests/test_results*.py download and load models"
    ),
    ("Running jobs on a Ray cluster", "pip install 'privsched[ray]'"): (
        "installs into the environment and needs a Ray cluster at http://head:8265; tests/test_ray_executor.py runs a local one"
    ),
    ("Running jobs on a Ray cluster", "mkdir ray-node"): (
        "a Ray head takes 10-15 s to start on two cores, and `ray stop` stops every cluster of the machine; "
        "tests/test_ray_executor.py runs jobs on a one-machine cluster started away from the ledger"
    ),
    ("Layout", "privsched/budgets/"): "a listing of the source tree, not a command",
}

#: Lines of a runnable block that are not run, with the reason.
LINES_NOT_RUN = {
    "privsched serve --policy dpf-n --n 100": "serves until interrupted; the next block runs against such a server",
    "privsched serve --listen 0.0.0.0:8470": "serves until interrupted, off loopback, with the reader's certificate",
}

#: YAML blocks loaded as pipeline specifications only (a dry-run would need the dataset's schema).
SPECIFICATIONS = {"Training a model on a table"}

#: Python blocks that define a job function: defined here (their imports resolve), run as jobs elsewhere.
DEFINITIONS = {"Training a model on a table": "train_clicks"}


@dataclass
class Block:
    section: str
    language: str
    text: str
    line: int

    @property
    def first(self) -> str:
        return self.text.splitlines()[0].strip()


def readme_blocks() -> list[Block]:
    """The README's fenced blocks, each with the heading it falls under."""
    blocks, section, fence = [], "", None
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if fence is None and line.startswith("#"):
            section = line.lstrip("#").strip()
        elif fence is None and line.startswith("```"):
            fence = Block(section, line[3:].strip(), "", number + 1)
        elif fence is not None and line.startswith("```"):
            blocks.append(fence)
            fence = None
        elif fence is not None:
            fence.text += line + "\n"
    return blocks


def listed(block: Block) -> str | None:
    """Why ``block`` is not run, or None."""
    return next((why for (section, first), why in NOT_RUNNABLE.items() if section == block.section and block.first.startswith(first)), None)


def not_run(line: str) -> str | None:
    """A shell no-op quoting why ``line`` is not run, or None when it is."""
    why = next((why for start, why in LINES_NOT_RUN.items() if line.startswith(start)), None)
    return None if why is None else ": " + shlex.quote(f"not run: {why}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Section:
    """A fresh folder where one section's blocks run in order, with the shell the README assumes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVSCHED_")} | {"PYTHONPATH": str(REPO)}
        self.servers: list[subprocess.Popen] = []
        self.token = ""  # an admin's token, once a block printed one

    def bash(self, block: Block, substitutions: dict[str, str]) -> str:
        text = block.text
        for old, new in substitutions.items():
            assert old in text, f"README line {block.line}: the fixture's placeholder {old!r} is gone"
            text = text.replace(old, new)
        lines = [not_run(line) or line for line in text.splitlines()]
        python = shlex.quote(sys.executable)  # `privsched` and `python3` are this checkout's
        shell = f'privsched() {{ {python} -m privsched "$@"; }}\npython3() {{ {python} "$@"; }}\nset -eo pipefail\n'
        done = subprocess.run(["bash", "-c", shell + "\n".join(lines)], cwd=self.folder, env=self.env, capture_output=True, text=True)
        assert done.returncode == 0, f"README line {block.line} ({block.section}) exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def fixture(self, block: Block, commands: str) -> str:
        """Run ``commands``, a fixture of ``block``'s, as a block of the same section."""
        return self.bash(Block(block.section, "bash", commands, block.line), {})

    def python(self, *args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=self.folder, env=self.env, capture_output=True, text=True)
        assert done.returncode == 0, f"python {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def serve(self) -> str:
        """Start ``privsched serve`` on a free loopback port; its URL once it holds the database."""
        port = free_port()
        command = [sys.executable, "-m", "privsched", "serve", "--listen", f"127.0.0.1:{port}"]
        server = subprocess.Popen(command, cwd=self.folder, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.servers.append(server)
        summary = [server.stdout.readline() for _ in range(5)]  # printed once it holds the database
        assert summary[-1].startswith("  HTTP API  http://127.0.0.1:"), "".join(summary)
        return f"http://127.0.0.1:{port}"

    def close(self) -> None:
        for server in self.servers:
            server.terminate()
            server.communicate(timeout=300)


def write_npz_days(folder: Path, keys: list[str]) -> None:
    """Two small, different block files (the same content twice would be refused)."""
    (folder / "data").mkdir()
    for i, key in enumerate(keys):
        np.savez(folder / "data" / f"{key}.npz", sentiment=np.arange(i + 3) % 2)


def write_events(section: Section) -> None:
    """events.csv, written by the README's own generator in "Data in"."""
    generator = next(b for b in readme_blocks() if b.section == "Data in: importing a table" and b.language == "bash")
    script = generator.text.split("cat > mean-7d.yaml")[0]
    section.fixture(generator, script)


def run_ledger(section: Section, block: Block) -> None:
    write_npz_days(section.folder, ["2026-11-01", "2026-11-02"])
    # HEAD: the chain head `audit --export` printed, as the comment says
    section.bash(block, {"--expect HEAD": '--expect "$(privsched audit --export)"'})


def run_data_in(section: Section, block: Block) -> None:
    section.bash(block, {})  # the first block writes events.csv, the next imports it again
    if block.first.startswith("# events.csv"):
        assert '"value"' in (section.folder / "runs/privsched/1/work/metrics.json").read_text()


def run_simulation(section: Section, block: Block) -> None:
    if not (section.folder / "trace.json").exists():  # trace.json: the reader's trace, made as the block's last line makes one
        section.fixture(block, "privsched trace multi-block --out trace.json\n")
    section.bash(block, {})


def run_service(section: Section, block: Block) -> None:
    if block.first.startswith("privsched user add ana"):
        # the dataset `quota set reviews` names, with blocks from "Data in"
        write_events(section)
        setup = "privsched dataset create reviews --epsilon 10 --delta 1e-7\n"
        section.fixture(block, setup + "privsched blocks import reviews events.csv --by time --every day --bounds amount=0:200\n")
        section.token = section.bash(block, {}).splitlines()[0]  # ana's token, printed once
        assert section.token.startswith("psk_"), section.token
        return
    # pipeline.yaml: the "Data in" pipeline on reviews; 7: the pipeline the block submits
    spec = next(b for b in readme_blocks() if b.section == "Data in: importing a table").text
    (section.folder / "pipeline.yaml").write_text(spec.split("<<'YAML'\n")[1].split("YAML\n")[0].replace("events", "reviews"))
    url = section.serve()
    substitutions = {
        "https://sched.example:8470": url,
        "psk_...": section.token,
        "--dry-run ": "--dry-run || test $? -eq 3 ",  # waits (exit 3, as the comment says): 1/N unlocked per arrival
        "status 7; privsched cancel 7": "status 1; privsched cancel 1",
    }
    out = section.bash(block, substitutions)
    assert "waits: " in out and "pipeline 1 cancelled" in out, out


def run_pipeline_spec(section: Section, block: Block) -> None:
    """The pipeline example, dry-run on a `reviews` dataset of ten blocks (a dry-run reads no data)."""
    (section.folder / "pipeline.yaml").write_text(block.text)
    blocks = " ".join(f"2026-11-{day:02d}" for day in range(1, 11))
    setup = f"privsched dataset create reviews --epsilon 10 --delta 1e-7\nprivsched blocks add reviews {blocks}\n"
    section.fixture(block, setup)
    waits = section.fixture(block, "privsched submit pipeline.yaml --dry-run || test $? -eq 3\n")  # never 4: can never fit
    assert "waits: budget" in waits  # exit 3: nothing is unlocked before a scheduler's arrivals


def run_code_job(section: Section, block: Block) -> None:
    """The example job, run as a code job (the local operator may) on one day of events; the
    ledger in ``ledger/``, away from ``code/`` as code jobs require."""
    (section.folder / "code").mkdir()
    (section.folder / "code/jobs.py").write_text(block.text)
    spec = "name: count\ndataset: reviews\nblocks: {last: 1}\nepsilon: 1.0\njob: {function: code/jobs.py:count_reviews}\n"
    (section.folder / "count.yaml").write_text(spec)
    section.env["PRIVSCHED_DB"] = "ledger/privsched.db"
    (section.folder / "ledger").mkdir()
    write_events(section)
    run = (
        "privsched dataset create reviews --epsilon 10 --delta 1e-7\n"
        "privsched blocks import reviews events.csv --by time --every day --unlocked 1\n"
        "privsched submit count.yaml\nprivsched serve --until-idle\nprivsched result 1\n"
    )
    out = section.fixture(block, run)
    assert "pipeline 1 (count): completed" in out and "released count (ε=0.1)" in out, out


def run_python_api(section: Section, block: Block) -> None:
    (section.folder / "code").mkdir()
    (section.folder / "code/example.py").write_text(block.text)
    section.python("-c", "from workloads.reviews import write_blocks; write_blocks('data', days=2, per_day=500)")
    out = section.python("code/example.py").splitlines()
    assert out[0].startswith("completed 0.") and out[1] == "audit ok: True", out


RUNNERS: dict[str, Callable[[Section, Block], None]] = {
    "The budget ledger": run_ledger,
    "Data in: importing a table": run_data_in,
    "Pipelines and the scheduler": run_pipeline_spec,
    "Job sandbox and untrusted spend": run_code_job,
    "Simulation": run_simulation,
    "A shared service: the HTTP API, users, remote use": run_service,
    "The Python API": run_python_api,
}


def check_specification(block: Block, folder: Path) -> None:
    path = folder / f"spec-{block.line}.yaml"
    path.write_text(block.text)
    assert load_spec(path).name, block.text


def define(block: Block, name: str) -> None:
    namespace: dict = {}
    exec(compile(block.text, f"README.md:{block.line}", "exec"), namespace)
    assert callable(namespace[name])


def test_every_readme_block_is_run_or_listed_with_a_reason():
    unaccounted = [
        (b.line, b.section, b.first)
        for b in readme_blocks()
        if not listed(b)
        and b.section not in RUNNERS
        and not (b.language == "yaml" and b.section in SPECIFICATIONS)
        and not (b.language == "python" and b.section in DEFINITIONS)
    ]
    assert unaccounted == []
    names = {(b.section, b.first) for b in readme_blocks() if listed(b)}
    assert {key for key in NOT_RUNNABLE if not any(s == key[0] and f.startswith(key[1]) for s, f in names)} == set()


def run_section(name: str, blocks: list[Block], folder: Path) -> None:
    """One section's blocks, in order, in ``folder``."""
    folder.mkdir()
    section = Section(folder)
    try:
        for block in blocks:
            RUNNERS[name](section, block)
    finally:
        section.close()


@pytest.mark.slow
def test_readme_blocks_run_as_written(tmp_path: Path):
    """Each section in its own folder and thread, sections side by side: they share nothing,
    and most of their time is spent waiting on their commands' disk writes and servers."""
    sections: dict[str, list[Block]] = {}
    for block in readme_blocks():
        if listed(block):
            continue
        if block.language == "yaml" and block.section in SPECIFICATIONS:
            check_specification(block, tmp_path)
        elif block.section in RUNNERS and block.section not in DEFINITIONS:
            sections.setdefault(block.section, []).append(block)
        elif block.language == "python":
            define(block, DEFINITIONS[block.section])
    with ThreadPoolExecutor(max_workers=len(sections)) as pool:
        runs = [pool.submit(run_section, name, blocks, tmp_path / re.sub(r"\W+", "-", name)[:40]) for name, blocks in sections.items()]
        for run in runs:
            run.result()
