"""Discrete-event simulation of privacy budget scheduling, over generated workloads or traces."""

from privsched.simulation.api import load_workload, resolve_policy, run, simulate
from privsched.simulation.instance import Instance, compile_trace
from privsched.simulation.results import SimulationResult
from privsched.simulation.trace import Trace, TraceError, load_trace, parse_trace, save_trace

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
