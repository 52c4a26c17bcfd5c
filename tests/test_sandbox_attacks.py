"""Attacks from a real confined job, under a real supervisor, as root and as ``nobody``.

Each job runs under ``python -m privsched.jobs.runner`` exactly as an executor starts it:
once as root (where the tests run as root) and once as ``nobody``, an unprivileged uid in a
user namespace of its own (``unshare --user --map-user=65534``: this machine's Python may lie
where the real ``nobody`` cannot read it, so the uid is mapped rather than switched to).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from privsched.jobs.namespaces import available
from privsched.jobs.runner import JOB_VARIABLES, JobResult
from privsched.jobs.sandbox import abi_version
from tests.test_supervisor import blocks, hostile, write_context

REPO = Path(__file__).resolve().parents[1]
AS_NOBODY = ["unshare", "--user", "--map-user=65534", "--map-group=65534"]
SECRET = "s3cr3t-operator-value"


def _nobody_possible() -> bool:
    try:
        return subprocess.run([*AS_NOBODY, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_namespaces = pytest.mark.skipif(
    abi_version() == 0 or available() is not None, reason="this kernel offers no Landlock or no user namespaces"
)
USERS = [
    pytest.param("root", marks=[needs_namespaces, pytest.mark.skipif(os.geteuid() != 0, reason="the tests do not run as root")]),
    pytest.param("nobody", marks=[needs_namespaces, pytest.mark.skipif(not _nobody_possible(), reason="unshare cannot map a user here")]),
]


def run_as(user: str, context: Path) -> JobResult:
    """Supervise the job of ``context`` as ``user``, with the operator's secrets in the
    supervisor's environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PRIVSCHED_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}
    prefix = AS_NOBODY if user == "nobody" else []
    command = [*prefix, sys.executable, "-m", "privsched.jobs.runner", str(context), str(context.parent / "result.json")]
    done = subprocess.run(command, env=env, cwd=context.parent, capture_output=True, timeout=180)
    assert done.returncode in (0, 1), done.stderr.decode()[-2000:]
    return JobResult.from_json((context.parent / "result.json").read_text())


@pytest.fixture(scope="module", params=USERS)
def probed(request, tmp_path_factory) -> tuple[str, dict]:
    """What the probing job (tests.sandbox_jobs.probes) found, as each user."""
    folder = tmp_path_factory.mktemp(f"probes-{request.param}")
    result = run_as(request.param, write_context(folder / "run", hostile("probes"), blocks(folder)))
    assert result.completed, result.message
    return request.param, result.metrics


def test_a_job_cannot_open_a_packet_socket(probed):
    assert probed[1]["packet_socket"] == "EPERM"


def test_a_job_cannot_make_a_device_node(probed):
    assert probed[1]["device_node"] == "EPERM"


def test_what_the_filter_refuses_is_only_devices_and_packet_sockets(probed):
    assert probed[1]["fifo"] == probed[1]["unix_socket"] == "allowed"


def test_a_job_cannot_open_the_kernel_log(probed):
    assert probed[1]["kernel_log"] == "ENOENT"  # not in its /dev at all


def test_a_job_sees_no_process_but_its_own(probed):
    assert probed[1]["processes"] == [1]  # the init of its own PID namespace


def test_no_environment_a_job_can_read_holds_the_operators_secrets(probed):
    assert probed[1]["environs"] and all(SECRET not in text for text in probed[1]["environs"].values())


def test_a_jobs_environment_comes_from_the_allow_list_only(probed):
    environment = probed[1]["environment"]
    assert SECRET not in str(environment)
    assert set(environment) <= {*JOB_VARIABLES, "HOME", "TMPDIR"} | {name for name in environment if name.startswith("LC_")}
    assert environment["HOME"].endswith("/work") and "TMPDIR" in environment


def test_a_job_runs_as_an_unprivileged_uid_without_capabilities(probed):
    user, found = probed
    assert found["uid"] == 65534 if user in ("root", "nobody") else os.getuid()
    assert int(found["capabilities"], 16) == 0
    assert found["no_new_privs"] == "1" and found["seccomp"] == "2"


@pytest.mark.parametrize("user", USERS)
def test_another_runs_folder_cannot_become_a_namespace_package_code_root(user: str, tmp_path: Path):
    """``pythonpath: [mine, <runs>]`` with ``function: "1.evil:main"`` would make run 1's
    folder a portion of the namespace package ``1``, readable by the job: refused."""
    runs = tmp_path / "runs" / "ledger"
    victim = runs / "1"
    victim.mkdir(parents=True)
    (victim / "job.log").write_text(SECRET)
    mine = tmp_path / "mine"
    (mine / "1").mkdir(parents=True)
    (mine / "1" / "evil.py").write_text(f"def main(ctx):\n    ctx.report_metrics(stolen=open({str(victim / 'job.log')!r}).read())\n")
    job = {"function": "1.evil:main", "pythonpath": [str(mine), str(runs)]}
    result = run_as(user, write_context(runs / "2", job, blocks(tmp_path), protected=[str(runs)]))
    assert not result.completed and not result.touched_data
    assert result.message.startswith("not started") and str(runs) in result.message
    assert "stolen" not in result.metrics


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_jump_of_the_seccomp_filter_lands_on_an_instruction_and_every_path_returns(machine: str):
    from privsched.jobs.seccomp import program

    code = program(machine)
    for index, (opcode, taken, not_taken, _) in enumerate(code):
        if opcode & 0x07 == 0x05:  # BPF_JMP: targets are relative to the next instruction
            assert index + 1 + max(taken, not_taken) < len(code)
    assert code[-1][0] == 0x06  # BPF_RET
