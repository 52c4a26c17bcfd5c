"""User jobs that read imported blocks through their context (run by the job supervisor)."""

from __future__ import annotations


def reads_amounts(ctx) -> None:
    """Reads one column of every granted block as NumPy and reports what it saw."""
    columns = ctx.read(columns=["amount"], as_="numpy")
    ctx.report_metrics(columns=sorted(columns), records=int(len(columns["amount"])))
