"""Data-parallel DP-SGD jobs (``resources: {workers: N}`` or several GPUs): who may ask,
how the records are shared out, and a confined job trained by two processes charged what
one process is."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from privsched.budgets import Accounting, demand_vector
from privsched.budgets.mechanisms import mechanism_json
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.jobs.sandbox import abi_version
from privsched.service.resources import Pool
from privsched.spec import PipelineSpec, Resources, SpecError
from privsched.trainers.builtin import plan_mechanism
from privsched.trainers.distributed import noise_slice, shard
from privsched.trainers.memory import training_bytes

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-6
CLICKS = {
    "kind": "dpsgd",
    "model": "logreg",
    "sample_rate": 0.2,
    "epochs": 2,
    "lr": 0.05,
    "features": ["amount", "country"],
    "label": "clicked",
    "bounds": {"amount": [0, 200]},
    "categories": {"country": ["fr", "de", "us"]},
}


def pipeline(resources: dict, job: dict | None = None) -> dict:
    params = {k: v for k, v in CLICKS.items() if k != "kind"}
    job = job or {"kind": "dpsgd", "params": params}
    return {"name": "p", "dataset": "events", "blocks": {"last": 1}, "epsilon": 1.0, "job": job, "resources": resources}


@given(st.integers(0, 300), st.integers(1, 8))
def test_every_record_lands_in_exactly_one_share_by_its_position_modulo_the_processes(n, world):
    positions = torch.arange(n)
    shares = [shard((positions,), rank, world)[0] for rank in range(world)]
    assert sorted(torch.cat(shares).tolist()) == list(range(n))
    assert all(bool((share % world == rank).all()) for rank, share in enumerate(shares))


def test_a_job_holds_a_cpu_per_worker_and_one_process_per_gpu():
    assert Resources(workers=3, cpus=1).held_cpus == 3
    assert Resources(gpus=2).processes == 2 and Resources(workers=4).processes == 4


def test_more_workers_than_the_pool_has_cpus_is_refused_in_one_line():
    pool = Pool((), 2.0, 2**30)
    assert pool.refusal(Resources(workers=3)) == "the job asks for 3 workers but the pool has 2 CPU(s)"
    assert pool.refusal(Resources(workers=2)) is None


@pytest.mark.parametrize(
    ("resources", "job", "message"),
    [
        ({"workers": 2}, {"kind": "statistic", "params": {"query": "count"}}, "'workers' trains data-parallel DP-SGD only"),
        ({"workers": 3, "gpus": 2}, None, "'workers' (3) must equal 'gpus' (2)"),
        ({"workers": 65}, None, "workers"),
        ({"workers": 0}, None, "workers"),
    ],
)
def test_a_data_parallel_ask_that_cannot_be_met_is_refused_at_submit(resources, job, message):
    with pytest.raises(SpecError) as refused:
        PipelineSpec.parse(pipeline(resources, job))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def events_block(folder: Path, n: int) -> str:
    rng = np.random.default_rng(0)
    amount = rng.uniform(0, 200, n)
    country = rng.choice(np.array(["fr", "de", "us"]), n)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "day-0.npz"
    np.savez(path, amount=amount, country=country, clicked=((amount > 100) ^ (country == "us")).astype(np.int64))
    return str(path)


def write_context(folder: Path, block: str, workers: int, job: dict, function: str | None = None) -> Path:
    """A supervisor's context document for a DP-SGD ``job`` (or the test's ``function`` with
    ``job`` as its parameters) granted the plan of :data:`CLICKS` on one ``block``."""
    accounting = Accounting.rdp()
    mechanism = plan_mechanism(CLICKS, 2.0, DELTA, accounting)
    grant = demand_vector(mechanism, accounting)
    ctx = JobContext(
        1, "job", "events", accounting, DELTA, {"d": BlockGrant("d", block, grant)}, workers=workers, workdir=folder / "work", params=job
    )
    document = {**json.loads(ctx.to_json()), "plan": json.loads(mechanism_json(mechanism)), "epsilon": 2.0}
    document["job"] = {"function": function, "pythonpath": [str(REPO)]} if function else {"kind": "dpsgd"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "context.json").write_text(json.dumps(document))
    return folder / "context.json"


def run_supervised(folder: Path, block: str, workers: int, job: dict, sandbox: str, function: str | None = None) -> JobResult:
    write_context(folder, block, workers, job, function)
    command = [sys.executable, "-m", "privsched.jobs.runner", "context.json", "result.json", "--sandbox", sandbox]
    done = subprocess.run(command, cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return JobResult.from_json((folder / "result.json").read_text())


SANDBOX = "landlock" if abi_version() else "none"


@pytest.mark.slow
def test_a_confined_job_trained_by_two_workers_is_charged_what_one_process_is(tmp_path):
    block = events_block(tmp_path / "data", 2000)
    one = run_supervised(tmp_path / "one", block, 1, CLICKS, SANDBOX)
    two = run_supervised(tmp_path / "two", block, 2, CLICKS, SANDBOX)
    assert two.completed, two.message
    assert two.spent == one.spent
    assert two.metrics["workers"] == 2 and two.metrics["steps"] == one.metrics["steps"] == 10
    assert two.metrics["noise_multiplier"] == one.metrics["noise_multiplier"]


@pytest.mark.slow
def test_a_model_two_workers_cannot_train_fails_before_reading_data_and_is_charged_nothing(tmp_path):
    block = events_block(tmp_path / "data", 100)
    result = run_supervised(tmp_path / "run", block, 2, {**CLICKS, "grad_sample_mode": "hooks"}, SANDBOX)
    assert not result.completed and not result.touched_data
    assert "single-pass ghost clipping" in (result.message or "")


@pytest.mark.skipif(abi_version() < 4, reason="Landlock TCP rules need ABI 4")
def test_a_data_parallel_jobs_loopback_is_up_and_its_own_the_hosts_stays_out_of_reach(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        job = {"port": server.getsockname()[1]}
        block = events_block(tmp_path / "data", 10)
        result = run_supervised(tmp_path / "run", block, 2, job, "landlock", "tests.parallel_jobs:loopbacks")
    assert result.completed, result.message
    assert result.metrics == {"own": "connected", "host": "ConnectionRefusedError"}


@given(st.integers(0, 10**6), st.integers(1, 16))
def test_the_processes_noise_slices_cover_every_coordinate_once(numel, world):
    slices = [noise_slice(numel, rank, world) for rank in range(world)]
    assert slices[0].start == 0 and slices[-1].stop == numel
    assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))


def test_the_training_memory_counts_weights_gradients_optimizer_noise_and_per_sample_gradients():
    assert training_bytes(1000, "adam", "ghost", 64, 1) == 4 * 1000 * (2 + 2 + 5 + 1)
    assert training_bytes(1000, "sgd", "hooks", 64, 2) == 4 * 1000 * (2 + 0 + 5 + 64) * 2


@pytest.mark.parametrize(("memory", "refused"), [("1MiB", True), ("1GiB", False)])
def test_a_model_larger_than_the_jobs_memory_is_refused_at_submit_in_one_line_and_writes_nothing(tmp_path, dump_db, memory, refused):
    from tests.cli_inprocess import invoke, ledger_with_one_block

    db = ledger_with_one_block(tmp_path)
    before = dump_db(db)
    params = {k: v for k, v in CLICKS.items() if k != "kind"}
    job = {"kind": "dpsgd", "params": {**params, "model": "mlp", "hidden": [256, 256], "optimizer": "adam"}}
    spec = pipeline({"workers": 2, "memory": memory}, job) | {"blocks": ["d1"], "delta": 1e-8}
    (tmp_path / "p.json").write_text(json.dumps(spec))
    answer = invoke("submit", tmp_path / "p.json", db=db)
    if refused:
        assert answer.code == 1 and answer.stderr.count("\n") == 1  # 67,842 = 5·256+256 + 256·256+256 + 256·2+2; 4 B × 10 × 2
        need = "the model's 67,842 parameters need at least 5.18 MiB to train (adam, ghost, 2 process(es))"
        assert f"{need} but the job asks for 1 MiB" in answer.stderr
        assert dump_db(db) == before
    else:
        assert answer.code == 0, answer.stderr


def submit_reviews(tmp_path: Path, resources: dict, **pool):
    """A DP-SGD pipeline on synthetic reviews asking for ``resources``, run to the end on ``pool``."""
    from privsched import connect
    from workloads.reviews import write_blocks

    paths = write_blocks(tmp_path / "data", days=2, per_day=400, seed=0)
    with connect(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=10.0, delta=1e-7, accounting="rdp")
        client.add_blocks("reviews", [(path.stem, str(path)) for path in paths])
        job = {"kind": "dpsgd", "params": {"model": "mlp", "sample_rate": 0.1, "epochs": 1, "lr": 0.05}}
        spec = {"name": "dp", "dataset": "reviews", "blocks": {"last": 2}, "epsilon": 1.0, "delta": 1e-9, "job": job}
        run = client.submit({**spec, "resources": resources})
        client.run_until_idle("fcfs", tick=0.05, **pool)
        return client.status(run.id), run.metrics


@pytest.mark.slow
def test_a_pipeline_asking_for_two_workers_trains_on_two_processes_through_the_scheduler(tmp_path):
    info, metrics = submit_reviews(tmp_path, {"workers": 2}, cpus=2)
    assert info.state == "completed", info.message
    assert info.placement["cpus"] == 2 and metrics["workers"] == 2 and metrics["steps"] == 10


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_pipeline_asking_for_two_gpus_trains_on_both_with_nccl(tmp_path):
    info, metrics = submit_reviews(tmp_path, {"gpus": 2}, cpus=2, gpus=2)
    assert info.state == "completed", info.message
    assert metrics["device"] == "cuda" and metrics["workers"] == 2


@pytest.mark.slow
def test_a_data_parallel_job_forked_from_the_warm_fork_server_trains_on_two_processes(tmp_path):
    from privsched.service.executors.base import Launch
    from privsched.service.executors.local import LocalExecutor
    from privsched.service.resources import Placement
    from tests.test_fork_server import run, warm_server

    context = write_context(tmp_path / "run", events_block(tmp_path / "data", 2000), 2, CLICKS)
    launch = Launch(1, context, tmp_path / "run" / "result.json", tmp_path / "run" / "job.log", Placement((), 2.0, 0), time.time())
    executor = LocalExecutor()
    try:
        warm_server(executor)
        result = run(executor, launch)
    finally:
        assert executor.launcher is not None
        executor.launcher.close()
    assert result.completed, result.message
    assert result.metrics["workers"] == 2 and result.metrics["steps"] == 10
