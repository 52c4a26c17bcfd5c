"""Data-parallel DP-SGD across Ray nodes: one rank per Ray Train worker (``TorchTrainer``),
each rank a confined job process under a supervisor on its own node.

The Ray job's entry (:mod:`.ray_entry`) runs :func:`run_across_nodes` for a job the executor
sent with :data:`RANKS_VARIABLE` (a :class:`RankShape`). It starts a ``TorchTrainer`` with one
worker per rank (``ScalingConfig(num_workers=N, use_gpu=..., resources_per_worker=...)``),
whose loop (:func:`_train_loop`) is privsched's, never the job's:

1. the first worker picks the rendezvous: its node's address, a free port there and the
   network interface holding that address, and sends it to the others over Ray Train's own
   gloo group (which carries only this and the ranks' results);
2. each worker runs ``python -m privsched.jobs.runner`` on its node (a supervisor, its job
   confined as on one host) with its rank's context (:func:`rank_document`): the first rank's
   holds the granted blocks; every other rank's names no block location, so its supervisor
   could not open data if its job asked (the first rank sends it its share over the process
   group, :class:`privsched.trainers.distributed.GroupRanks`);
3. a rank whose supervisor ends failed says so (a Ray queue), and the others stop their
   supervisors (``SIGTERM``) rather than wait for it at the rendezvous or a collective;
4. the workers gather their supervisors' results; the first sends the driver (a Ray queue)
   :func:`combine` of them, the first rank's result (its supervisor measured the charge, as
   for one process), failed if any rank failed. The entry prints it as the job's result;
   only the scheduler opens the ledger.

``ray.train`` is imported only here, in the Ray job's driver and its workers.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from privsched.jobs.runner import JobResult
from privsched.service.executors.base import without_secrets
from privsched.service.resources import Placement

#: Environment variable carrying a job's :class:`RankShape` when its ranks train across nodes.
RANKS_VARIABLE = "PRIVSCHED_RANKS"
_SIOCGIFADDR = 0x8915  # netdevice(7): an interface's IPv4 address
_PR_SET_PDEATHSIG = 1
#: How a rank's failure begins when it was stopped because another rank failed.
STOPPED = "stopped as another rank failed"
#: Seconds between looks at whether another rank failed.
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class RankShape:
    """A data-parallel job's ranks and what each holds (an even share of its placement)."""

    workers: int
    gpus: float  # per rank: 1 on a job with a GPU per rank
    cpus: float  # per rank
    memory: int  # per rank, bytes (0: none asked)

    @classmethod
    def of(cls, placement: Placement, workers: int) -> RankShape:
        return cls(workers, len(placement.gpus) / workers, placement.cpus / workers, placement.memory // workers)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankShape:
        data = json.loads(text)
        return cls(int(data["workers"]), float(data["gpus"]), float(data["cpus"]), int(data["memory"]))

    def resources(self) -> dict[str, float]:
        """Ray Train's ``resources_per_worker``."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {}), **({"memory": self.memory} if self.memory else {})}


def ranks_held(shape: RankShape, node: dict[str, float]) -> int:
    """How many ranks of ``shape`` one node (its total resources) can hold at once."""
    fits = [node.get("CPU", 0) / shape.cpus + 1e-9]
    if shape.gpus:
        fits.append(node.get("GPU", 0) / shape.gpus + 1e-9)
    if shape.memory:
        fits.append(node.get("memory", 0) / shape.memory)
    return max(0, math.floor(min(fits)))


def rank_refusal(shape: RankShape, nodes: list[dict[str, float]]) -> str | None:
    """Why the alive ``nodes`` can never hold every rank at once, or None if they can."""
    held = sum(ranks_held(shape, node) for node in nodes)
    if held >= shape.workers:
        return None
    return (
        f"the Ray cluster can hold {held} of the job's {shape.workers} ranks of {shape.gpus:g} GPU(s), {shape.cpus:g} CPU(s) "
        f"and {shape.memory / 2**30:.3g} GiB each ({len(nodes)} node(s) alive)"
    )


def rank_document(document: dict[str, Any], rank: int, rendezvous: dict[str, Any], workdir: str) -> dict[str, Any]:
    """Rank ``rank``'s context document: the job's, with its rank, the rendezvous and its
    work folder; every rank but the first gets no block location (it reads no data)."""
    ranked = {**document, "rank": rank, "rendezvous": dict(rendezvous), "workdir": workdir}
    if rank > 0:
        ranked["blocks"] = [{**block, "location": None} for block in document["blocks"]]
    return ranked


def combine(results: list[JobResult]) -> JobResult:
    """The job's result from its ranks' (in rank order): the first rank's, which measured
    the charge, when every rank completed; else failed, with the reason of a rank that failed
    on its own (not one :data:`STOPPED` for another), its data as the first rank's supervisor saw it."""
    first = results[0]
    failed = [(rank, r) for rank, r in enumerate(results) if not r.completed]
    if not failed:
        return first
    rank, cause = min(failed, key=lambda f: f[1].message.startswith(STOPPED))
    message = (cause.message if rank == 0 else f"data-parallel rank {rank} failed: {cause.message}")[:500]
    return JobResult(
        first.pipeline_id, False, touched_data=first.touched_data, message=message, first_access=first.first_access, releases=first.releases
    )


def interface_of(address: str) -> str:
    """The network interface holding the IPv4 ``address`` (gloo and NCCL bind to it);
    ``OSError`` if none does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    raise OSError(f"no network interface holds {address}")


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _stop_with_parent() -> None:
    """A rank's supervisor gets ``SIGTERM`` (it ends its job and says whether data was read)
    when the Ray Train worker that started it dies: a stopped Ray job, a failed rank."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def run_rank(document: dict[str, Any], sandbox: str, shape: RankShape, gpus: list[str], stop: Callable[[], bool]) -> JobResult:
    """Supervise one rank's job on this node (``python -m privsched.jobs.runner``), without
    the node's secret variables, with thread pools sized to the rank's CPUs and, as its only
    visible devices, the ``gpus`` Ray gave this worker (Ray Train shows every worker of a node
    all of that node's workers' GPUs). Once ``stop()`` holds (another rank failed), the
    supervisor is sent ``SIGTERM``: it ends its job and says whether data was read."""
    threads = str(max(1, int(shape.cpus)))
    env = {**without_secrets(os.environ), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    stopped = False
    with tempfile.TemporaryDirectory(prefix="privsched-rank-") as folder:
        context, result = Path(folder) / "context.json", Path(folder) / "result.json"
        context.write_text(json.dumps(document))
        command = [sys.executable, "-m", "privsched.jobs.runner", str(context), str(result), "--sandbox", sandbox]
        supervisor = subprocess.Popen(command, env=env, cwd=folder, preexec_fn=_stop_with_parent)
        while supervisor.poll() is None:
            if not stopped and stop():
                supervisor.terminate()
                stopped = True
            try:
                supervisor.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        if result.exists():
            ended = JobResult.from_json(result.read_text())
            return replace(ended, message=f"{STOPPED}: {ended.message}") if stopped and not ended.completed else ended
    message = f"the supervisor of rank {document['rank']} exited with {supervisor.returncode}"
    return JobResult(int(document["pipeline_id"]), False, message=message)


def _work_folder(workdir: str) -> str:
    """The first rank's work folder, where the job's outputs go: its run folder where this node
    has it, else a folder of this node that stays (as a one-process Ray job's own folder does).
    The other ranks write nothing to keep: theirs is removed."""
    return workdir if Path(workdir).parent.is_dir() else tempfile.mkdtemp(prefix="privsched-work-")


def _train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: the module docstring's steps 1 to 4."""
    import ray
    import ray.train
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    chosen: list[Any] = [None]
    if rank == 0:
        address = ray.util.get_node_ip_address()
        chosen = [{"address": address, "port": _free_port(address), "interface": interface_of(address)}]
    dist.broadcast_object_list(chosen, src=0)
    document, failures = config["document"], config["failures"]
    gpus = [str(g) for g in ray.get_gpu_ids()]
    with tempfile.TemporaryDirectory(prefix="privsched-work-") as spare:
        ranked = rank_document(document, rank, chosen[0], _work_folder(document["workdir"]) if rank == 0 else spare)
        result = run_rank(ranked, config["sandbox"], RankShape.from_json(config["shape"]), gpus, lambda: failures.qsize() > 0)
    if not result.completed:
        failures.put_nowait(rank)  # the others stop rather than wait for it at the rendezvous or a collective
    results: list[Any] = [None] * world
    dist.all_gather_object(results, result.to_json())
    if rank == 0:
        config["results"].put(combine([JobResult.from_json(r) for r in results]).to_json())


def run_across_nodes(document: dict[str, Any], shape: RankShape, sandbox: str) -> JobResult:
    """Train the job's ranks with Ray Train's ``TorchTrainer`` on the cluster this Ray job
    runs on; the job's result (:func:`combine`), or a failure with its data assumed touched
    when the trainer ended without one."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty, Queue

    pipeline_id = int(document["pipeline_id"])
    here = str(Path(__file__).resolve().parents[3])  # the ranks import the privsched their driver runs
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}})
    try:
        results = Queue(maxsize=1, actor_options={"num_cpus": 0})
        failures = Queue(actor_options={"num_cpus": 0})
        with tempfile.TemporaryDirectory(prefix="privsched-train-") as storage:
            trainer = TorchTrainer(
                _train_loop,
                train_loop_config={
                    "document": document,
                    "sandbox": sandbox,
                    "shape": shape.to_json(),
                    "results": results,
                    "failures": failures,
                },
                scaling_config=ScalingConfig(num_workers=shape.workers, use_gpu=shape.gpus > 0, resources_per_worker=shape.resources()),
                torch_config=TorchConfig(backend="gloo"),
                run_config=RunConfig(name=f"privsched-{pipeline_id}", storage_path=storage, failure_config=FailureConfig(max_failures=0)),
            )
            trainer.fit()
        return JobResult.from_json(results.get(timeout=60))
    except Empty:
        return JobResult(pipeline_id, False, message="the ranks' Ray Train run ended without a result")
    except Exception as exc:  # a rank's worker died, or Ray Train failed: the data may have been read
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return JobResult(pipeline_id, False, message=f"the ranks' Ray Train run failed: {line}")
    finally:
        ray.shutdown()
