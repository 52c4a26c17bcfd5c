"""What a simulation run reports: per-pipeline outcomes, a summary, budget over time, JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privsched.budgets.accounting import Accounting


def used_share(consumed: np.ndarray, capacity: np.ndarray, accounting: Accounting) -> np.ndarray:
    """Fraction of each block's budget that is used up (reduces the last axis).

    basic: the binding dimension, ``max(ε/ε_G, δ/δ_G)``. RDP: ``min`` over live orders of
    ``consumed(α)/capacity(α)``: the block is exhausted only once every order is (docs/design.md §3.3).
    """
    live = accounting.live(capacity) & (capacity > 0)
    share = np.where(live, consumed / np.where(live, capacity, 1.0), np.nan)
    if accounting.is_rdp:
        return np.nan_to_num(np.nanmin(np.where(live, share, np.inf), axis=-1), posinf=0.0)
    return np.nan_to_num(np.nanmax(np.where(live, share, -np.inf), axis=-1), neginf=0.0)


def _mean_granted(fraction: np.ndarray, granted: np.ndarray) -> float | None:
    """The mean fraction of their demands the granted pipelines received (None: no grant)."""
    return float(fraction[granted].mean()) if granted.any() else None


@dataclass
class SimulationResult:
    """One run of one policy on one workload."""

    workload: str
    policy: str
    params: dict
    accounting: str
    pipeline_ids: list[str]
    arrival: np.ndarray
    status: list[str]  # granted | timed_out | pending
    grant_time: np.ndarray  # nan unless granted
    klass: list[str]
    block_ids: list[str]
    block_used: np.ndarray  # (B,) share of each block's budget consumed at the end
    sample_times: np.ndarray  # (S,)
    sample_used: np.ndarray  # (S, B) share consumed over time
    block_wasted: np.ndarray  # (B,) share set aside for pipelines that timed out (round robin)
    passes: int = 0
    runtime_s: float = 0.0  # wall-clock time of the event loop
    cpu_s: float = 0.0  # CPU time of the event loop (what contention on the machine does not inflate)
    #: (P,) under elastic demands, the fraction of its demand each pipeline was granted (nan
    #: unless granted); None when every demand is fixed.
    fraction: np.ndarray | None = None

    @property
    def granted_mask(self) -> np.ndarray:
        return np.array([s == "granted" for s in self.status], dtype=bool)

    @property
    def delays(self) -> np.ndarray:
        """Waiting time of every granted pipeline (grant − arrival)."""
        mask = self.granted_mask
        return self.grant_time[mask] - self.arrival[mask]

    @property
    def granted(self) -> int:
        return int(self.granted_mask.sum())

    def summary(self) -> dict:
        """Counts overall and by class, delay percentiles, budget used per block."""
        status = np.array(self.status, dtype=object)
        klass = np.array(self.klass, dtype=object)
        by_class = {}
        for name in sorted(set(self.klass)):
            members = klass == name
            by_class[name or "all"] = {
                "pipelines": int(members.sum()),
                "granted": int((members & (status == "granted")).sum()),
            }
        delays = self.delays
        return {
            "workload": self.workload,
            "policy": self.policy,
            "params": self.params,
            "accounting": self.accounting,
            "pipelines": len(self.status),
            "granted": self.granted,
            "timed_out": int((status == "timed_out").sum()),
            "pending": int((status == "pending").sum()),
            "by_class": by_class,
            "delay_p50": float(np.percentile(delays, 50)) if delays.size else None,
            "delay_p99": float(np.percentile(delays, 99)) if delays.size else None,
            "block_used": {b: round(float(u), 6) for b, u in zip(self.block_ids, self.block_used)},
            "mean_block_used": float(self.block_used.mean()) if self.block_used.size else 0.0,
            "mean_block_wasted": float(self.block_wasted.mean()) if self.block_wasted.size else 0.0,
            "passes": self.passes,
            "runtime_s": round(self.runtime_s, 4),
            "cpu_s": round(self.cpu_s, 4),
            **({} if self.fraction is None else {"mean_fraction": _mean_granted(self.fraction, self.granted_mask)}),
        }

    def to_dict(self) -> dict:
        return {
            "summary": self.summary(),
            "pipelines": {
                "id": self.pipeline_ids,
                "arrival": self.arrival.tolist(),
                "status": self.status,
                "grant_time": [None if t != t else t for t in self.grant_time.tolist()],  # NaN: not granted
                "class": self.klass,
                **({} if self.fraction is None else {"fraction": [None if f != f else f for f in self.fraction.tolist()]}),
            },
            "blocks": {"id": self.block_ids, "used": self.block_used.tolist(), "wasted": self.block_wasted.tolist()},
            "budget_over_time": {"time": self.sample_times.tolist(), "used": self.sample_used.tolist()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> SimulationResult:
        s, p = data["summary"], data["pipelines"]
        return cls(
            workload=s["workload"],
            policy=s["policy"],
            params=s["params"],
            accounting=s["accounting"],
            pipeline_ids=list(p["id"]),
            arrival=np.asarray(p["arrival"], dtype=float),
            status=list(p["status"]),
            grant_time=np.array([np.nan if t is None else t for t in p["grant_time"]], dtype=float),
            klass=list(p["class"]),
            block_ids=list(data["blocks"]["id"]),
            block_used=np.asarray(data["blocks"]["used"], dtype=float),
            block_wasted=np.asarray(data["blocks"]["wasted"], dtype=float),
            sample_times=np.asarray(data["budget_over_time"]["time"], dtype=float),
            sample_used=np.asarray(data["budget_over_time"]["used"], dtype=float).reshape(-1, len(data["blocks"]["id"])),
            passes=s["passes"],
            runtime_s=s["runtime_s"],
            cpu_s=s["cpu_s"],
            fraction=np.array([np.nan if f is None else f for f in p["fraction"]], dtype=float) if "fraction" in p else None,
        )

    @classmethod
    def from_json(cls, text: str) -> SimulationResult:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())
