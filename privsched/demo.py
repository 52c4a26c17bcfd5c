"""The end-to-end demonstration: a review-like data stream, a mix of DP statistics and DP-SGD
models, scheduled by DPF on the local executor, and a report of what each pipeline got.

Everything goes through the public client API (:mod:`privsched.client`), exactly as a user
would drive it; nothing here is specific to the demo except the choice of pipelines.
"""

from __future__ import annotations

import datetime as dt
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privsched.ledger.models import DatasetInfo, PipelineInfo
from privsched.readouts import readout

#: Marks a folder as written by the demo, so that a rerun may clear it.
MARKER = ".privsched-demo"
FIRST_DAY = dt.date(2026, 11, 1)
#: The most daily blocks a demo writes (ten years: each is a file of synthetic reviews).
MAX_DAYS = 3650
WAITING = {"pending": "waiting: does not fit the unlocked budget", "timed_out": "no budget before its timeout"}


@dataclass(frozen=True)
class DemoConfig:
    out: Path = Path("runs/demo")
    days: int = 12
    reviews_per_day: int = 1000
    epsilon: float = 10.0
    delta: float = 1e-7
    policy: str = "dpf-n"
    n: int = 12
    seed: int = 0
    #: Keep only the first ``limit`` pipelines of the mix (a quick run); None keeps all.
    limit: int | None = None


def _day(index: int) -> str:
    return (FIRST_DAY + dt.timedelta(days=index)).isoformat()


def _model(name: str, model: str, epsilon: float, blocks: dict, **training: Any) -> dict:
    """A DP-SGD pipeline (an "elephant") on the given days."""
    params = {"model": model, "sample_rate": 0.05, "epochs": 2, "lr": 0.05, "optimizer": "adam", **training}
    return {
        "name": name,
        "blocks": blocks,
        "epsilon": epsilon,
        "delta": 1e-9,
        "job": {"kind": "dpsgd", "params": params},
    }


def _statistic(name: str, query: dict, epsilon: float, blocks: dict) -> dict:
    """A DP statistic (a "mouse") with the Laplace mechanism on the given days."""
    return {
        "name": name,
        "blocks": blocks,
        "epsilon": epsilon,
        "delta": 0.0,
        "job": {"kind": "statistic", "params": {"noise": "laplace", **query}},
    }


def pipeline_mix(days: int) -> list[dict]:
    """Twenty-four pipelines in arrival order: DP statistics (mice) on a few recent days or a
    date range, DP-SGD models (elephants) on many, at several ε. Two greedy pipelines that
    ask for most of every day's budget arrive early: DPF serves the small ones first."""
    count = {"query": "count"}
    mean_rating = {"query": "mean", "column": "rating", "bounds": [1.0, 5.0]}
    histogram = {"query": "histogram", "column": "rating", "bounds": [0.5, 5.5], "bins": 5}
    positives = {"query": "sum", "column": "sentiment", "bounds": [0.0, 1.0]}
    last_week = {"from": _day(days - 7), "to": _day(days - 1)}
    every_day = {"from": _day(0), "to": _day(days - 1)}

    def recent(k: int) -> dict:
        return {"last": min(k, days)}

    return [
        _statistic("daily-count", count, 0.1, recent(1)),
        _model("sentiment-text-e1", "text", 1.0, recent(10)),
        _model("greedy-text-e8", "text", 8.0, recent(days)),
        _statistic("mean-rating-3d", mean_rating, 0.1, recent(3)),
        _model("sentiment-logreg-e1", "logreg", 1.0, recent(6)),
        _statistic("rating-histogram-week", histogram, 0.5, last_week),
        _model("sentiment-mlp-e5", "mlp", 5.0, recent(4)),
        _statistic("greedy-mean-all", mean_rating, 9.0, every_day),
        _statistic("positives-2d", positives, 0.05, recent(2)),
        _model("sentiment-text-e05", "text", 0.5, recent(12)),
        _statistic("count-week", count, 0.05, last_week),
        _model("sentiment-mlp-e1", "mlp", 1.0, recent(8)),
        _statistic("mean-rating-1d", mean_rating, 0.5, recent(1)),
        _model("sentiment-logreg-e05", "logreg", 0.5, recent(10)),
        _statistic("rating-histogram-3d", histogram, 0.1, recent(3)),
        _model("sentiment-text-e5", "text", 5.0, recent(6)),
        _statistic("positives-week", positives, 0.1, last_week),
        _model("sentiment-lstm-e5", "lstm", 5.0, recent(3)),
        _statistic("daily-count-2", count, 0.5, recent(1)),
        _model("sentiment-mlp-e05", "mlp", 0.5, recent(12)),
        _statistic("mean-rating-week", mean_rating, 0.05, last_week),
        _model("sentiment-logreg-e5", "logreg", 5.0, recent(3)),
        _statistic("rating-histogram-all", histogram, 0.1, every_day),
        _statistic("count-all", count, 0.1, every_day),
    ]


def prepare(config: DemoConfig) -> Path:
    """Clear a previous demo's folder and write the synthetic review blocks; returns the
    database path."""
    from workloads.reviews import write_blocks

    if not 2 <= config.days <= MAX_DAYS:
        raise ValueError(f"--days must be from 2 to {MAX_DAYS}, got {config.days}")
    if config.out.exists():
        if not (config.out / MARKER).exists():
            raise ValueError(f"{config.out} exists and was not written by the demo: choose another --out")
        shutil.rmtree(config.out)
    try:
        config.out.mkdir(parents=True)
        (config.out / MARKER).touch()
    except OSError as exc:
        raise ValueError(f"cannot write the demo's folder {config.out}: {exc.strerror or exc}") from None
    write_blocks(config.out / "blocks", config.days, config.reviews_per_day, seed=config.seed)
    return config.out / "privsched.db"


def submit_all(client, config: DemoConfig) -> list[int]:
    """Create the dataset and its daily blocks, then submit the pipeline mix."""
    client.create_dataset("reviews", epsilon=config.epsilon, delta=config.delta, accounting="rdp")
    blocks = config.out / "blocks"
    client.add_blocks("reviews", [(_day(i), str((blocks / f"day-{i:04d}.npz").resolve())) for i in range(config.days)])
    mix = pipeline_mix(config.days)[: config.limit]
    return [client.submit({**spec, "dataset": "reviews"}).id for spec in mix]


def serve_with_progress(client, config: DemoConfig, ids: list[int], console) -> float:
    """Run the scheduler until idle in a background thread while a progress bar follows the
    pipelines; returns the wall time it took."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    errors: list[BaseException] = []

    def serve() -> None:
        try:
            client.serve(config.policy, n=config.n, until_idle=True, tick=0.5)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=serve, name="privsched-serve", daemon=True)
    thread.start()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("scheduling", total=len(ids))
        while thread.is_alive():
            states = [p.state for p in client.list() if p.id in set(ids)]
            finished = sum(s.is_final() for s in states)
            summary = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
            progress.update(task, completed=finished, description=f"scheduling ({summary})")
            thread.join(0.5)
    if errors:
        raise errors[0]
    return time.monotonic() - started


def epsilon_of(vector: np.ndarray, dataset: DatasetInfo) -> float:
    """A charged budget vector as one ε, as every charged curve is shown: under RDP what the
    curve converts to on the dataset's orders at its δ_G (:func:`privsched.readouts.readout`);
    under basic accounting its ε."""
    return readout(vector, dataset).epsilon


def baselines(client, infos: list[PipelineInfo]) -> dict[int, float]:
    """Held-out accuracy of each granted model trained without privacy on the same blocks."""
    from workloads.reviews import non_private_baseline

    blocks = {b.key: b.location for b in client.blocks("reviews")}
    out = {}
    for info in infos:
        if info.job.get("kind") != "dpsgd" or info.state != "completed":
            continue
        job = {"kind": "dpsgd", **info.job["params"]}
        out[info.id] = non_private_baseline([blocks[k] for k in info.block_keys], job)["heldout_accuracy"]
    return out


def result_text(metrics: dict) -> str:
    if "heldout_accuracy" in metrics:
        return f"accuracy {metrics['heldout_accuracy']:.3f}"
    value = metrics.get("value")
    if isinstance(value, list):
        return "histogram " + " ".join(f"{v:.0f}" for v in value)
    return f"{metrics.get('query', 'value')} {value:.2f}" if isinstance(value, (int, float)) else ""


def budget_figure(client, path: Path) -> Path:
    """Stacked bars of each block's budget (consumed, allocated, unlocked, locked) as
    fractions of its capacity, at the order where the block has the most budget left."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = client.blocks("reviews")
    alphas = client.ledger.get_dataset("reviews").accounting.alphas
    rows = []
    for block in blocks:
        live = block.capacity > 0
        remaining = np.where(live, (block.capacity - block.allocated - block.consumed) / np.where(live, block.capacity, 1), -np.inf)
        best = int(np.argmax(remaining))
        cap = block.capacity[best]
        rows.append(
            (
                block.key,
                alphas[best],
                [block.consumed[best] / cap, block.allocated[best] / cap, max(block.unlocked[best], 0) / cap, block.locked[best] / cap],
            )
        )
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    colours = ("#c0392b", "#e67e22", "#27ae60", "#95a5a6")
    for i, (label, colour) in enumerate(zip(("consumed", "allocated", "unlocked", "locked"), colours)):
        heights = np.array([r[2][i] for r in rows])
        ax.bar(x, heights, bottom=bottom, label=label, color=colour)
        bottom += heights
    ax.set_xticks(x, [f"{r[0][5:]}\nα={r[1]:g}" for r in rows], fontsize=8)
    ax.set_ylabel("fraction of block capacity")
    ax.set_title("Privacy budget per daily block after scheduling (at each block's best RDP order)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(client, ids: list[int], console) -> None:
    """Print the table of every pipeline, then models next to their non-private baselines."""
    from rich.table import Table

    dataset = client.ledger.get_dataset("reviews")
    infos = [client.status(i) for i in ids]
    table = Table(title=f"Pipelines (ε: the charged curve at the dataset's δ_G = {dataset.delta:g})")
    for column in ("id", "name", "blocks", "status", "ε granted", "ε consumed", "result", "run time"):
        table.add_column(column, justify="right" if column in ("id", "blocks", "ε granted", "ε consumed") else "left")
    for info in infos:
        demand = next(iter(info.demands.values()))
        consumed = next(iter(info.consumed.values())) if info.consumed else None
        granted = info.state in ("granted", "running", "completed", "failed")
        run = client.run(info.id)
        seconds = (info.finished_at - info.started_at) if info.finished_at and info.started_at else None
        table.add_row(
            str(info.id),
            info.name,
            str(len(info.block_keys)),
            info.state,
            f"{epsilon_of(demand, dataset):.2f}" if granted else "-",
            f"{epsilon_of(consumed, dataset):.2f}" if consumed is not None else "-",
            result_text(run.metrics) or info.message or WAITING.get(info.state, ""),
            f"{seconds:.1f} s" if seconds is not None else "-",
        )
    console.print(table)

    accuracy = baselines(client, infos)
    models = Table(title="DP-SGD models against the same model trained without privacy")
    for column in ("name", "ε charged", "blocks", "private accuracy", "non-private accuracy"):
        models.add_column(column)
    for info in infos:
        if info.id in accuracy:
            metrics = client.run(info.id).metrics
            models.add_row(
                info.name,
                f"{epsilon_of(next(iter(info.demands.values())), dataset):.2f}",
                str(len(info.block_keys)),
                f"{metrics['heldout_accuracy']:.3f}",
                f"{accuracy[info.id]:.3f}",
            )
    console.print(models)


def run_demo(config: DemoConfig, console) -> Path:
    """Run the whole demonstration; returns the path of the budget figure."""
    import privsched as ps

    started = time.monotonic()
    db = prepare(config)
    console.print(f"privsched demo — database {db}, {config.days} daily blocks of synthetic reviews")
    with ps.connect(db) as client:
        ids = submit_all(client, config)
        console.print(f"submitted {len(ids)} pipelines; scheduling with {config.policy} (N = {config.n}) on the local executor")
        serve_with_progress(client, config, ids, console)
        report(client, ids, console)
        audit = client.audit()
        figure = budget_figure(client, config.out / "budget.png")
    console.print(f"ledger audit: {'ok' if audit.ok else 'FAILED'} ({audit.blocks} blocks, {audit.events} events)")
    for violation in audit.violations:
        console.print(f"  {violation}")
    console.print(f"budget per block: {figure}")
    console.print(f"done in {time.monotonic() - started:.0f} s")
    if not audit.ok:
        raise RuntimeError("the ledger audit failed")
    return figure
