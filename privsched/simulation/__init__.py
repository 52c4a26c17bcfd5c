"""Discrete-event simulation of privacy budget scheduling, over generated workloads or traces.

Names are imported on first use, so that simulating a generated workload does not import
the trace models (pydantic) it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privsched.simulation.api import load_workload, resolve_policy, run, simulate
    from privsched.simulation.compile import compile_trace
    from privsched.simulation.instance import Instance
    from privsched.simulation.results import SimulationResult
    from privsched.simulation.limits import TraceError
    from privsched.simulation.trace import Trace, load_trace, parse_trace, save_trace

#: Public name -> module that defines it.
_API = {
    "Instance": "privsched.simulation.instance",
    "SimulationResult": "privsched.simulation.results",
    "Trace": "privsched.simulation.trace",
    "TraceError": "privsched.simulation.limits",
    "compile_trace": "privsched.simulation.compile",
    "load_trace": "privsched.simulation.trace",
    "load_workload": "privsched.simulation.api",
    "parse_trace": "privsched.simulation.trace",
    "resolve_policy": "privsched.simulation.api",
    "run": "privsched.simulation.api",
    "save_trace": "privsched.simulation.trace",
    "simulate": "privsched.simulation.api",
}

__all__ = [
    "Instance",
    "SimulationResult",
    "Trace",
    "TraceError",
    "compile_trace",
    "load_trace",
    "load_workload",
    "parse_trace",
    "resolve_policy",
    "run",
    "save_trace",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
