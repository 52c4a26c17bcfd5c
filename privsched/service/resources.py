"""Compute resources: the pool a scheduler places granted jobs on (GPUs, CPUs, memory).

GPUs are detected without importing torch: ``CUDA_VISIBLE_DEVICES`` when it is set, else
``nvidia-smi -L``; they can also be declared (``serve --gpus N`` declares N fake GPUs, which
is how tests exercise placement on a machine without any). The pool a scheduler serves with
is recorded next to the database (:mod:`privsched.service.rundirs`), so that ``submit``
rejects a job that asks for more than the whole pool has.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from privsched.budgets.bounds import check_number

if TYPE_CHECKING:  # the specification models (pydantic) load only where a pool is sized
    from privsched.spec import Resources


@dataclass(frozen=True)
class Pool:
    """The whole compute a scheduler has: GPU ids (as CUDA_VISIBLE_DEVICES names them),
    CPU count and memory in bytes."""

    gpus: tuple[str, ...]
    cpus: float
    memory: int
    #: A cluster's alive nodes as (GPUs, CPUs, memory) each; empty for one machine.
    nodes: tuple[tuple[float, float, int], ...] = ()
    #: Whether data-parallel ranks may train across those nodes (``serve --train-across-nodes``).
    across_nodes: bool = False

    def refusal(self, need: Resources, ranks: int = 1) -> str | None:
        """Why a job can never run on this pool, or None if it fits the empty pool: more than
        the pool has, or ``ranks`` > 1 data-parallel ranks that no node holds together where
        they may not train across nodes."""
        if ranks > 1 and self.nodes and not self.across_nodes:
            largest = max(self.nodes)
            if not any(g >= need.gpus and c >= need.held_cpus and m >= need.memory for g, c, m in self.nodes):
                return (
                    f"the job's {ranks} data-parallel ranks fit no single node of the cluster (largest: {largest[0]:g} "
                    f"GPU(s), {largest[1]:g} CPU(s)) and the scheduler does not train across nodes (serve --train-across-nodes)"
                )
        short = []
        if need.gpus > len(self.gpus):
            short.append(f"{need.gpus} GPU(s) but the pool has {len(self.gpus)}")
        if need.held_cpus > self.cpus:
            asked = f"{need.workers} workers" if need.workers > need.cpus else f"{need.cpus:g} CPU(s)"
            short.append(f"{asked} but the pool has {self.cpus:g} CPU(s)")
        if need.memory > self.memory:
            short.append(f"{need.memory / 2**30:.3g} GiB of memory but the pool has {self.memory / 2**30:.3g} GiB")
        return "the job asks for " + " and ".join(short) if short else None

    def to_dict(self) -> dict:
        return {"gpus": list(self.gpus), "cpus": self.cpus, "memory": self.memory, "nodes": self.nodes, "across_nodes": self.across_nodes}

    @classmethod
    def from_dict(cls, data: dict) -> Pool:
        nodes = tuple((float(g), float(c), int(m)) for g, c, m in data.get("nodes", ()))
        return cls(tuple(str(g) for g in data["gpus"]), float(data["cpus"]), int(data["memory"]), nodes, bool(data.get("across_nodes")))


def detect_gpus() -> tuple[str, ...]:
    """GPU ids visible to this process: CUDA_VISIBLE_DEVICES if set, else ``nvidia-smi -L``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1")
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(m.group(1) for m in re.finditer(r"^GPU (\d+):", listing, re.MULTILINE))


def detect_cpus() -> float:
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return float(os.cpu_count() or 1)


def detect_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def make_pool(gpus: int | None = None, cpus: float | None = None, memory: int | None = None) -> Pool:
    """The machine's pool, with any of its sizes overridden (declared GPUs are named 0..N-1)."""
    from privsched.spec import MAX_CPUS, MAX_GPUS, MAX_MEMORY, MIN_CPUS

    if gpus is not None:
        check_number(gpus, "the pool's GPU count", 0, MAX_GPUS, integer=True)
    if cpus is not None:
        check_number(cpus, "the pool's CPUs", MIN_CPUS, MAX_CPUS)
    if memory is not None:
        check_number(memory, "the pool's memory (bytes)", 0, MAX_MEMORY, integer=True)
    gpu_ids = detect_gpus() if gpus is None else tuple(str(i) for i in range(gpus))
    return Pool(gpu_ids, detect_cpus() if cpus is None else float(cpus), detect_memory() if memory is None else memory)


@dataclass(frozen=True)
class Placement:
    """Where a job runs: its GPUs and its share of CPUs and memory."""

    gpus: tuple[str, ...]
    cpus: float
    memory: int

    def to_dict(self) -> dict:
        return {"gpus": list(self.gpus), "cpus": self.cpus, "memory": self.memory}

    @classmethod
    def from_record(cls, record: dict | None) -> Placement:
        """The placement a running pipeline's record holds (nothing for a missing field)."""
        record = record or {}
        return cls(tuple(str(g) for g in record.get("gpus", ())), float(record.get("cpus", 0)), int(record.get("memory", 0)))


@dataclass
class FreeCompute:
    """What is left of a pool while jobs run on it."""

    pool: Pool
    _held: dict[int, Placement] = field(default_factory=dict)

    @property
    def free_gpus(self) -> list[str]:
        taken = {g for p in self._held.values() for g in p.gpus}
        return [g for g in self.pool.gpus if g not in taken]

    @property
    def free_cpus(self) -> float:
        return self.pool.cpus - sum(p.cpus for p in self._held.values())

    @property
    def free_memory(self) -> int:
        return self.pool.memory - sum(p.memory for p in self._held.values())

    def place(self, pipeline_id: int, need: Resources) -> Placement | None:
        """Reserve compute for a job, or None if it does not fit what is free now."""
        gpus = self.free_gpus
        if need.gpus > len(gpus) or need.held_cpus > self.free_cpus + 1e-9 or need.memory > self.free_memory:
            return None
        placement = Placement(tuple(gpus[: need.gpus]), need.held_cpus, need.memory)
        self._held[pipeline_id] = placement
        return placement

    def hold(self, pipeline_id: int, placement: Placement) -> None:
        """Account for a job already running on known compute (after a restart)."""
        self._held[pipeline_id] = placement

    def release(self, pipeline_id: int) -> None:
        self._held.pop(pipeline_id, None)

    @property
    def busy(self) -> bool:
        return bool(self._held)
