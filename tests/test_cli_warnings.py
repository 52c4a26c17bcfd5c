"""Library warnings (NumPy's here) are held back by the command line until the command has
ended: shown as one ``warning:`` line each after a command that succeeded, dropped when it
failed, so that a refusal is always the only line (privsched/cli/__init__.py, ``main``).

Both cases run real commands whose generation makes NumPy warn: a tiny deviation overflows
the Gaussian weights of the heterogeneous workload (the trace is still written), and a tiny
batch window overflows the arrival times (the trace is refused). Each test first checks,
in-process, that the generation does warn, so that it cannot pass for want of a warning."""

from __future__ import annotations

import warnings
from pathlib import Path

from tests.cli_inprocess import invoke
from workloads import generate


def generated(**params) -> tuple[list[str], str | None]:
    """The warnings that generating the heterogeneous workload with ``params`` raises, and
    its refusal (None when it succeeds)."""
    refusal = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            generate("heterogeneous", duration=5.0, **params)
        except ValueError as exc:
            refusal = str(exc)
    return [f"{w.category.__name__}: {w.message}" for w in caught], refusal


def test_warnings_are_shown_after_a_command_that_succeeded(tmp_path: Path):
    assert generated(alpha_std=1e-300) == (["RuntimeWarning: overflow encountered in square"], None)
    outcome = invoke("trace", "heterogeneous", "--out", tmp_path / "t.json", "--duration", "5", "-p", "alpha_std=1e-300")
    assert outcome.code == 0, outcome.stderr
    assert (tmp_path / "t.json").exists()
    assert outcome.stderr == "warning: RuntimeWarning: overflow encountered in square\n"


def test_warnings_are_dropped_when_a_command_fails_with_one_line(tmp_path: Path):
    caught, refusal = generated(batch=5e-324)
    assert caught == ["RuntimeWarning: overflow encountered in divide"] and "must be finite" in refusal
    outcome = invoke("trace", "heterogeneous", "--out", tmp_path / "t.json", "--duration", "5", "-p", "batch=5e-324")
    assert outcome.code != 0
    assert outcome.stderr.startswith("error: ") and outcome.stderr.count("\n") == 1, outcome.stderr
    assert "warning" not in outcome.stderr.lower()
    assert not (tmp_path / "t.json").exists()
