"""Data-parallel DP-SGD across Ray nodes (Ray Train's ``TorchTrainer``): which jobs train
across nodes, what each rank is given, how the ranks' results make the job's, and one
pipeline trained end to end on a local cluster."""

from __future__ import annotations

import errno
import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from privsched import connect
from privsched.jobs.context import JobContext
from privsched.jobs.runner import JobResult, job_confinement
from privsched.jobs.sandbox import Confinement, abi_version, confine
from privsched.ledger import LedgerError
from privsched.service.executors.ray import UnplaceableJob, across_nodes
from privsched.service.executors.ray_local import free_port, local_cluster
from privsched.service.executors.ray_train import STOPPED, RankShape, combine, interface_of, rank_document, rank_refusal, run_rank
from privsched.service.resources import Placement, Pool
from privsched.service.serve import ServeOptions, Startup
from privsched.spec import Resources
from tests.conftest import REPO
from tests.support.ray import db, ended, serving, wait_until  # noqa: F401 -- db: the fixture
from tests.test_supervisor import write_context

NODE = {"CPU": 2.0, "GPU": 1.0, "memory": 4e9}


def test_a_job_of_one_process_never_trains_across_nodes():
    assert across_nodes(Placement((), 1.0, 0), 1, [NODE], allowed=True) is None


def test_ranks_one_node_holds_run_as_one_ray_job_without_the_operators_option():
    assert across_nodes(Placement((), 2.0, 0), 2, [NODE], allowed=False) is None


def test_ranks_one_node_holds_train_across_nodes_with_the_operators_option():
    shape = across_nodes(Placement((), 2.0, 2 * 10**9), 2, [NODE], allowed=True)
    assert shape == RankShape(workers=2, gpus=0.0, cpus=1.0, memory=10**9)


def test_ranks_no_node_holds_train_across_nodes_with_the_operators_option():
    shape = across_nodes(Placement(("0", "1"), 2.0, 0), 2, [NODE, NODE], allowed=True)
    assert shape == RankShape(workers=2, gpus=1.0, cpus=1.0, memory=0)


def test_ranks_no_node_holds_are_refused_without_the_operators_option():
    with pytest.raises(UnplaceableJob, match=r"no node of the Ray cluster can hold 2 GPU\(s\).*serve --train-across-nodes"):
        across_nodes(Placement(("0", "1"), 2.0, 0), 2, [NODE, NODE], allowed=False)


def test_more_ranks_than_the_cluster_holds_are_refused():
    with pytest.raises(UnplaceableJob, match="the Ray cluster can hold 2 of the job's 3 ranks"):
        across_nodes(Placement(("0", "1", "2"), 3.0, 0), 3, [NODE, NODE], allowed=True)


def test_a_node_holds_as_many_ranks_as_its_scarcest_resource_allows():
    shape = RankShape(workers=4, gpus=0.0, cpus=1.0, memory=3 * 10**9)
    assert rank_refusal(shape, [{"CPU": 8.0, "memory": 6e9}]) == (
        "the Ray cluster can hold 2 of the job's 4 ranks of 0 GPU(s), 1 CPU(s) and 2.79 GiB each (1 node(s) alive)"
    )
    assert rank_refusal(shape, [{"CPU": 8.0, "memory": 6e9}, {"CPU": 2.0, "memory": 9e9}]) is None


DOCUMENT = {
    "pipeline_id": 7,
    "workers": 2,
    "workdir": "/runs/7/work",
    "blocks": [{"key": "b0", "location": "/data/b0.parquet", "grant": [0.5]}],
    "job": {"kind": "dpsgd"},
}
RENDEZVOUS = {"address": "10.0.0.1", "port": 29400, "interface": "eth0"}


def test_the_first_rank_is_given_the_blocks_the_rendezvous_and_its_rank():
    first = rank_document(DOCUMENT, 0, RENDEZVOUS, "/runs/7/work")
    assert first["blocks"] == DOCUMENT["blocks"] and (first["rank"], first["rendezvous"]) == (0, RENDEZVOUS)


def test_every_other_rank_is_given_no_block_location_and_its_own_work_folder():
    other = rank_document(DOCUMENT, 1, RENDEZVOUS, "/tmp/w1")
    assert other["blocks"] == [{"key": "b0", "location": None, "grant": [0.5]}]
    assert (other["rank"], other["workdir"]) == (1, "/tmp/w1")
    assert DOCUMENT["blocks"][0]["location"] == "/data/b0.parquet"  # the job's own document is untouched


def test_the_jobs_result_is_the_first_ranks_when_every_rank_completed():
    first = JobResult(7, True, {"b0": [0.25]}, metrics={"steps": 4})
    assert combine([first, JobResult(7, True, {"b0": [0.5]})]) == first


def test_a_failed_rank_fails_the_job_charged_as_the_first_rank_saw_its_data():
    first = JobResult(7, True, {"b0": [0.25]}, first_access=12.0)
    result = combine([first, JobResult(7, False, message="boom")])
    assert (result.completed, result.touched_data, result.first_access) == (False, True, 12.0)
    assert result.message == "data-parallel rank 1 failed: boom"


def test_a_failed_rank_before_the_first_read_fails_the_job_uncharged():
    first = JobResult(7, False, touched_data=False, message="not started")
    result = combine([first, JobResult(7, True)])
    assert (result.completed, result.touched_data) == (False, False)


def test_the_loopback_address_is_found_on_the_loopback_interface():
    assert interface_of("127.0.0.1") == "lo"


def test_an_address_no_interface_holds_is_an_error():
    with pytest.raises(OSError, match="no network interface holds 192.0.2.254"):
        interface_of("192.0.2.254")


def _binds_when_confined(port: int) -> dict[int, int]:
    """Which local ports a process confined as a rank across nodes (rendezvous ``port``)
    may bind: port -> 0 when it may, else the errno."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            confine(Confinement(read=(), write=(), rendezvous_port=port))
            found = {}
            for wanted in (0, port, port + 1):
                with socket.socket() as sock:
                    try:
                        sock.bind(("127.0.0.1", wanted))
                        found[wanted] = 0
                    except OSError as exc:
                        found[wanted] = exc.errno
            theirs.sendall(json.dumps(found).encode())
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    answer = ours.recv(4096)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return {int(k): v for k, v in json.loads(answer).items()}


@pytest.mark.skipif(abi_version() < 4, reason="needs Landlock's TCP rules (ABI 4)")
def test_a_rank_across_nodes_may_bind_only_its_rendezvous_port_and_an_ephemeral_one():
    port = free_port()
    assert _binds_when_confined(port) == {0: 0, port: 0, port + 1: errno.EACCES}


def test_a_rank_across_nodes_keeps_the_host_network_and_no_other_job_does():
    ctx = JobContext.from_json(json.dumps({**CONTEXT, "workers": 2, "rendezvous": RENDEZVOUS}))
    rules = job_confinement({"job": {"kind": "dpsgd"}}, ctx, Path("/tmp/x"), network=False)
    assert (rules.rendezvous_port, rules.loopback, rules.network) == (29400, False, False)
    forked = job_confinement({"job": {"kind": "dpsgd"}}, JobContext.from_json(json.dumps({**CONTEXT, "workers": 2})), Path("/tmp/x"), False)
    assert (forked.rendezvous_port, forked.loopback) == (None, True)


CONTEXT = {
    "pipeline_id": 7,
    "name": "p",
    "dataset": "d",
    "accounting": {"accounting": "basic"},
    "delta": 1e-7,
    "blocks": [],
    "device": "cpu",
    "workdir": "/tmp/w",
    "params": {},
}
CLUSTER = Pool(("0", "1"), 4.0, 8 * 10**9, nodes=((1.0, 2.0, 4 * 10**9), (1.0, 2.0, 4 * 10**9)))


def test_ranks_no_node_holds_are_refused_at_submit_unless_the_scheduler_trains_across_nodes():
    need = Resources(gpus=2)
    assert CLUSTER.refusal(need, ranks=2) == (
        "the job's 2 data-parallel ranks fit no single node of the cluster (largest: 1 GPU(s), 2 CPU(s)) "
        "and the scheduler does not train across nodes (serve --train-across-nodes)"
    )
    assert replace(CLUSTER, across_nodes=True).refusal(need, ranks=2) is None
    assert CLUSTER.refusal(Resources(workers=2), ranks=2) is None  # one node holds both


def test_a_job_of_one_process_asking_for_gpus_no_node_holds_is_left_to_the_executor():
    assert CLUSTER.refusal(Resources(gpus=2)) is None


def test_more_ranks_than_the_cluster_has_are_refused_at_submit_even_across_nodes():
    assert replace(CLUSTER, across_nodes=True).refusal(Resources(gpus=3), ranks=3) == "the job asks for 3 GPU(s) but the pool has 2"


def test_the_recorded_pool_keeps_its_nodes_and_whether_ranks_train_across_them():
    pool = replace(CLUSTER, across_nodes=True)
    assert Pool.from_dict(json.loads(json.dumps(pool.to_dict()))) == pool


def test_training_across_nodes_is_refused_for_the_local_executor_in_one_line():
    with pytest.raises(ValueError, match="^--train-across-nodes applies to the ray executor only$"):
        ServeOptions.parse(policy="fcfs", executor="local", train_across_nodes=True).check()


def test_a_rank_stopped_as_another_failed_does_not_hide_the_first_failure():
    stopped = JobResult(7, False, touched_data=True, message=f"{STOPPED}: the job was stopped (signal 15) before it ended")
    result = combine([stopped, JobResult(7, False, message="boom")])
    assert (result.completed, result.touched_data, result.message) == (False, True, "data-parallel rank 1 failed: boom")


@pytest.mark.skipif(abi_version() == 0, reason="this kernel offers no Landlock sandbox")
def test_a_ranks_supervisor_is_stopped_once_another_rank_failed_and_its_job_is_charged_nothing_before_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    context = write_context(tmp_path, {"function": "tests.sandbox_jobs:waits", "pythonpath": [str(REPO)]}, {"d1": str(tmp_path / "d1")})
    document = json.loads(context.read_text())
    started = Path(document["workdir"], "started")
    result = run_rank(document | {"rank": 1}, "landlock", RankShape(2, 0.0, 1.0, 0), [], stop=started.exists)
    assert (result.completed, result.touched_data) == (False, False)
    assert result.message == f"{STOPPED}: the job was stopped (signal 15) before it ended"


def test_serve_refuses_training_across_nodes_without_the_ray_executor_in_one_line(run_cli, tmp_path: Path):
    served = run_cli("serve", "--train-across-nodes", "--until-idle", "--sandbox", "none", env={"PRIVSCHED_DB": str(tmp_path / "p.db")})
    assert (served.returncode, served.stderr) == (1, "error: --train-across-nodes applies to the ray executor only\n")
    assert not (tmp_path / "p.db").exists()


@pytest.mark.skipif(abi_version() == 0, reason="this kernel offers no Landlock sandbox")
def test_a_rank_other_than_the_first_cannot_read_its_jobs_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "d1").write_bytes(b"rows")
    job = {"function": "tests.sandbox_jobs:reads_block_files", "pythonpath": [str(REPO)]}
    document = json.loads(write_context(tmp_path / "job", job, {"d1": str(tmp_path / "d1")}).read_text())
    first, other = (rank_document(document, rank, RENDEZVOUS, document["workdir"]) for rank in (0, 1))
    shape = RankShape(2, 0.0, 1.0, 0)
    assert run_rank(first, "landlock", shape, [], stop=lambda: False).metrics["sizes"] == {"": 4}  # a one-file block
    refused = run_rank(other, "landlock", shape, [], stop=lambda: False)
    assert (refused.completed, refused.touched_data) == (False, False)
    assert refused.message.endswith("KeyError: \"block 'd1' is not granted\""), refused.message


@pytest.mark.slow
def test_ranks_no_node_holds_train_across_two_nodes_through_torchtrainer_charged_one_process_plan(db: Path):
    job = {"kind": "dpsgd", "params": {"model": "logreg", "sample_rate": 0.25, "epochs": 1, "lr": 0.1}}
    spec = {"name": "dp2", "dataset": "reviews", "blocks": {"last": 2}, "epsilon": 1.0, "delta": 1e-8, "job": job}
    with local_cluster(cpus=1, memory=2 * 10**9, nodes=(1,)) as address:
        with serving(db, address, train_across_nodes=True) as check, connect(db) as client:
            assert [node[1] for node in client.runs.recorded_pool().nodes] == [1.0, 1.0]
            one = client.submit({**spec, "name": "dp1"})
            wait_until(ended(client, one.id), check)
            two = client.submit({**spec, "resources": {"workers": 2}})
            wait_until(ended(client, two.id), check)
            assert one.status == "completed", one.message
            assert two.status == "completed", f"{two.message}\n{client.runs.log(two.id).read_text()[-3000:]}"
            assert two.metrics["workers"] == 2 and two.metrics["steps"] == one.metrics["steps"] == 4
            assert two.metrics["noise_multiplier"] == one.metrics["noise_multiplier"]
            for key in one.consumed:
                assert np.allclose(two.consumed[key], one.consumed[key], rtol=0, atol=1e-12)
            assert client.audit().ok


def test_a_job_of_one_process_holds_its_fraction_of_a_cpu():
    assert Resources(cpus=0.5).held_cpus == 0.5


def test_serve_says_at_start_that_ranks_train_across_the_clusters_nodes():
    startup = Startup(Path("p.db"), ServeOptions.parse(policy="fcfs").policy_spec(), replace(CLUSTER, across_nodes=True), "ray", "landlock")
    pool, executor = startup.lines(None)[2:4]
    assert pool == "  pool      4 CPUs, 7.45 GiB memory, GPUs 0,1 (2 nodes)"
    assert executor == "  executor  ray, ranks across nodes, sandbox landlock"


def test_a_submission_whose_ranks_no_node_holds_is_refused_in_one_line_and_nothing_is_written(db: Path, dump_db):
    with connect(db) as client:
        client.runs.record_pool(CLUSTER)  # as a scheduler serving on a cluster of two 1-GPU nodes records it
        before = dump_db(db)
        job = {"kind": "dpsgd", "params": {"model": "logreg", "sample_rate": 0.25, "epochs": 1}}
        spec = {"name": "dp2", "dataset": "reviews", "blocks": {"last": 2}, "epsilon": 1.0, "delta": 1e-8, "job": job}
        with pytest.raises(LedgerError) as refused:
            client.submit({**spec, "resources": {"gpus": 2}})
    assert str(refused.value).endswith(
        "the job's 2 data-parallel ranks fit no single node of the cluster (largest: 1 GPU(s), 2 CPU(s)) "
        "and the scheduler does not train across nodes (serve --train-across-nodes)"
    )
    assert "\n" not in str(refused.value) and dump_db(db) == before
