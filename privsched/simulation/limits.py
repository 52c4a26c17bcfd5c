"""Limits of the trace format and its one error type, without the models that validate a
trace (:mod:`privsched.simulation.trace`), so that code checking a number against them
does not import pydantic."""

from __future__ import annotations

from privsched.errors import BadInput

#: Largest trace file read, in bytes.
MAX_TRACE_BYTES = 64 * 2**20
#: Largest magnitude of an arrival time in a trace, in seconds (about 300 years).
MAX_TIME = 1e10
#: Most RDP orders a trace may use.
MAX_ORDERS = 256


class TraceError(BadInput):
    """A trace that cannot be simulated; the message names the offending entry."""
