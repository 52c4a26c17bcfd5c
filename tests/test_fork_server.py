"""The warm launcher: jobs forked from a fork server that has torch and Opacus imported, on
real processes (the sandbox tests need Landlock)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from privsched.budgets import Accounting
from privsched.client import Client
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.jobs.sandbox import abi_version
from privsched.service.executors.base import Launch
from privsched.service.executors.local import LocalExecutor, find_by_token
from privsched.service.executors.fork_server import send
from privsched.service.executors.result_pipe import ResultPipe
from privsched.service.executors.warm_launcher import WARM_MODULES, ForkServer, WarmLauncher
from privsched.policies import make_policy
from privsched.service.resources import Placement, Pool
from privsched.service.rundirs import RunDirs
from privsched.service.serve import serve
from tests.support.faults import EPSILON, client, job_runs  # noqa: F401 -- client: a fixture

REPO = Path(__file__).resolve().parents[1]
GRANT = [1.0, 1e-9]
landlock = pytest.mark.skipif(abi_version() == 0, reason="this kernel offers no Landlock")


def launch_for(
    folder: Path, function: str, *, pipeline_id: int = 1, cpus: float = 1.0, token: str | None = None, params: dict | None = None
) -> Launch:
    folder.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(
        pipeline_id=pipeline_id,
        name="job",
        dataset="reviews",
        accounting=Accounting.basic(),
        delta=1e-9,
        blocks={"d1": BlockGrant("d1", "/data/d1", np.array(GRANT))},
        device="cpu",
        workdir=folder / "work",
        params=params or {},
    )
    job = {"function": f"tests.fork_jobs:{function}", "pythonpath": [str(REPO)]}
    (folder / "context.json").write_text(json.dumps({**json.loads(ctx.to_json()), "job": job}))
    return Launch(
        pipeline_id, folder / "context.json", folder / "result.json", folder / "job.log", Placement((), cpus, 0), time.time(), token=token
    )


def warm_server(executor: LocalExecutor) -> ForkServer:
    """The executor's fork server, once it is ready to fork jobs."""
    assert executor.launcher is not None
    deadline = time.monotonic() + 120
    while True:
        server = executor.launcher.maintain()
        if server is not None and server.ready:
            return server
        assert executor.launcher.failure is None, executor.launcher.failure
        assert time.monotonic() < deadline, "the fork server never became ready"
        time.sleep(0.05)


def run(executor: LocalExecutor, launch: Launch, *, forked: bool = True) -> JobResult:
    executor.start(launch)
    assert (executor._jobs[launch.pipeline_id].server is not None) == forked
    while True:
        for result in executor.poll(time.time()):
            return result
        time.sleep(0.02)


def seen(launch: Launch) -> dict:
    return json.loads((launch.context.parent / "work" / "seen.json").read_text())


@pytest.fixture(scope="module")
def executor() -> LocalExecutor:
    executor = LocalExecutor()
    warm_server(executor)
    yield executor
    assert executor.launcher is not None
    executor.launcher.close()


def test_the_warm_modules_and_a_noisy_release_import_none_of_opendps_extras():
    # opendp.prelude imports its extras, which import whatever optional packages are
    # installed (scikit-learn, pandas, ...): on a machine that has them a thread started
    # and the fork server, which must not hold one, never became ready.
    code = (
        "import importlib, sys\n"
        f"for name in {list(WARM_MODULES)!r}: importlib.import_module(name)\n"
        "from privsched.statistics.noise import noisy\n"
        "import numpy as np\n"
        "noisy(np.array([3]), 'laplace', 1.0, True)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opendp.extras', 'opendp.prelude'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_two_forked_jobs_draw_fresh_entropy_and_size_their_thread_pools(executor: LocalExecutor, tmp_path: Path):
    one = launch_for(tmp_path / "one", "draws", pipeline_id=1, cpus=1.0)
    two = launch_for(tmp_path / "two", "draws", pipeline_id=2, cpus=2.0)
    assert run(executor, one).completed and run(executor, two).completed
    first, second = seen(one), seen(two)
    for generator in ("random", "numpy", "torch"):
        assert first[generator] != second[generator], generator
    assert (first["torch_threads"], second["torch_threads"]) == (1, 2)
    assert set(first["blas_threads"]) <= {1} and set(second["blas_threads"]) <= {2}
    assert first["cuda"] == second["cuda"] == ""


@landlock
def test_the_sandbox_holds_in_a_forked_job(executor: LocalExecutor, tmp_path: Path):
    secret = tmp_path / "ledger.db"
    secret.write_text("budget\n")
    launch = launch_for(tmp_path / "run", "escapes", params={"path": str(secret)})
    assert run(executor, launch).completed
    assert seen(launch) == {"read": "denied", "write": "denied"}
    assert secret.read_text() == "budget\n"


def test_a_forked_job_holds_no_descriptor_but_its_log_and_its_supervisor_channel(executor: LocalExecutor, tmp_path: Path):
    launch = launch_for(tmp_path, "lists_descriptors")
    assert run(executor, launch).completed
    fds = seen(launch)["fds"]
    assert (fds.pop("0"), fds.pop("1"), fds.pop("2")) == (os.devnull, str(launch.log), str(launch.log))
    assert [target.split(":")[0] for target in fds.values()] == ["socket"]  # no pipe, no fork server's socket


def test_a_forked_job_is_found_by_its_launch_token(executor: LocalExecutor, tmp_path: Path):
    launch = launch_for(tmp_path, "draws", token="f" * 32)
    executor.start(launch)
    pid = executor._jobs[launch.pipeline_id].pid
    try:
        deadline = time.monotonic() + 60
        while find_by_token("f" * 32) is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the child shows its token once it has read its spec
        assert find_by_token("f" * 32) == pid
    finally:
        while not executor.poll(time.time()):
            time.sleep(0.02)


def test_a_child_forked_for_a_launch_given_up_on_runs_nothing(executor: LocalExecutor, tmp_path: Path):
    server = warm_server(executor)
    launch = launch_for(tmp_path, "draws")
    spec_read, spec_write = os.pipe()
    result_read, result_write = os.pipe()
    with open(launch.log, "ab") as log:
        send(server.sock, {"launch": 1}, [spec_read, log.fileno(), result_write])
    for fd in (spec_read, result_write):
        os.close(fd)
    pid = server._reply()
    assert pid is not None
    server.children.add(pid)
    os.close(spec_write)  # the executor gives up before writing the spec
    while server.exit_code(pid) is None:
        time.sleep(0.01)
    assert server.exit_code(pid) == 0
    assert os.read(result_read, 100) == b""
    os.close(result_read)
    assert not (tmp_path / "work").exists() and not launch.result.exists()


def test_a_child_that_cannot_take_its_launch_over_is_refused_with_its_data_untouched(executor: LocalExecutor, tmp_path: Path):
    server = warm_server(executor)
    launch = launch_for(tmp_path, "draws")
    spec = {"argv": [str(launch.context), str(launch.result)], "env": {}, "cwd": str(tmp_path / "gone"), "threads": 1}
    pipe = ResultPipe()
    with open(launch.log, "ab") as log:
        pid = server.launch(spec, log.fileno(), pipe.write_fd)
    pipe.handed_over()
    assert pid is not None
    while server.exit_code(pid) is None:
        time.sleep(0.01)
    result = pipe.result(launch.pipeline_id)
    pipe.close()
    assert result is not None and not result.completed and not result.touched_data
    assert result.message.startswith("not started: the fork server's child could not be set up")
    assert JobResult.from_json(launch.result.read_text()) == result
    assert not (tmp_path / "work").exists()


def huge_pages_collapse() -> str | None:
    """Why this kernel cannot collapse memory into huge pages on request, or None."""
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[never]" in setting.read_text():
        return "transparent huge pages are off on this machine"
    if tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit()) < (6, 1):
        return "this kernel has no MADV_COLLAPSE (Linux 6.1)"
    return None


@pytest.mark.skipif(huge_pages_collapse() is not None, reason=str(huge_pages_collapse()))
def test_the_fork_server_keeps_its_memory_in_huge_pages(executor: LocalExecutor):
    server = warm_server(executor)
    rollup = Path(f"/proc/{server.pid}/smaps_rollup").read_text().splitlines()
    huge_kb = next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))
    assert huge_kb >= 64 * 1024  # of about 280 MB of its own: each fork and exit copies and frees far fewer page-table entries


def test_an_executor_says_how_its_next_job_starts():
    executor = LocalExecutor()
    assert executor.start_mode() == "cold: the fork server starts with the first job"
    executor.prepare()
    assert executor.start_mode() in ("cold: the fork server is starting", "warm")
    warm_server(executor)
    assert executor.start_mode() == "warm"
    assert executor.launcher is not None
    executor.launcher.close()
    assert LocalExecutor(warm=False).start_mode() is None


def test_a_killed_fork_server_is_replaced_and_its_jobs_start_cold_meanwhile(tmp_path: Path):
    executor = LocalExecutor()
    first = warm_server(executor)
    os.kill(first.pid, signal.SIGKILL)
    first.process.wait()
    launch = launch_for(tmp_path / "cold", "draws", pipeline_id=1)
    assert run(executor, launch, forked=False).completed
    second = warm_server(executor)
    assert second is not first and second.pid != first.pid
    assert run(executor, launch_for(tmp_path / "warm", "draws", pipeline_id=2)).completed
    assert executor.launcher is not None
    executor.launcher.close()


def test_a_fork_server_that_cannot_start_says_why_once_and_jobs_start_cold(tmp_path: Path, capsys):
    executor = LocalExecutor()
    assert executor.launcher is not None
    launcher = WarmLauncher(sys.executable, executor._base_environment, ("argparse", "privsched_no_such_module"))
    executor.launcher = launcher
    deadline = time.monotonic() + 60
    while launcher.failure is None:
        launcher.maintain()
        assert time.monotonic() < deadline, "the fork server neither failed nor said why"
        time.sleep(0.05)
    assert launcher.failure == "ModuleNotFoundError: No module named 'privsched_no_such_module'"
    assert executor.start_mode() == f"cold: the fork server could not start ({launcher.failure})"
    assert run(executor, launch_for(tmp_path / "cold", "draws"), forked=False).completed
    launcher._retry_at = 0.0  # the next one starts now, fails alike, and is not reported again
    while launcher.maintain() is not None and not launcher.server.dead:
        time.sleep(0.05)
    launcher.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"privsched: jobs start cold: the fork server could not start ({launcher.failure})"]


def test_a_job_forked_under_one_scheduler_is_adopted_and_settled_by_the_next(client: Client):
    """The first scheduler forks the job from its warm fork server, then stops; its fork
    server ends with it (the job runs on); the next scheduler adopts the job by its pid file
    and settles it once it ends."""
    executor = LocalExecutor()
    server = warm_server(executor)
    job = {"function": "tests.fault_jobs:counted_wait_then_spend"}
    pipeline_id = client.submit({"name": "p", "dataset": "reviews", "blocks": ["b0"], "epsilon": EPSILON, "job": job}).id
    stop = threading.Event()
    first = threading.Thread(
        target=serve, args=(client.path, make_policy("fcfs"), executor, Pool((), cpus=4.0, memory=0)), kwargs={"tick": 0.05, "stop": stop}
    )
    first.start()
    work = RunDirs(client.path).workdir(pipeline_id)
    while not (work / "runs.txt").exists():
        time.sleep(0.02)
    assert executor._jobs[pipeline_id].server is server
    stop.set()
    first.join()
    assert executor.launcher is not None
    executor.launcher.close()
    (work / "go").touch()
    client.run_until_idle("fcfs", tick=0.05, cpus=4, gpus=0)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "completed", info.message
    assert job_runs(client, pipeline_id) == 1
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(EPSILON)  # a user job: its grant
    assert client.ledger.audit().ok
