"""DP-SGD overhead: time per epoch of private training against non-private training of the
same model on the same synthetic reviews, in one process, for every zoo model and every
clipping mode that applies to it ("ghost": single-pass ghost clipping, all-linear models
only; "opacus-ghost": Opacus' two-pass ghost clipping where a layer has a norm sampler, fast
gradient clipping elsewhere; "hooks": Opacus' per-sample gradients from hooks).

    .venv/bin/python benchmarks/dpsgd.py [--records 10000] [--sample-rate 0.05] [--threads 1]
        [--models mlp,text] [--modes ghost,opacus-ghost,hooks]

The defaults are how the built-in jobs run: the demo's DP-SGD pipelines train with Adam at
q = 0.05 on about ten daily blocks of 1,000 reviews (8,000 training reviews, batches of
about 400), in a process the executor gives one CPU (``OMP_NUM_THREADS=1``). Prints a markdown table;
the ratio is private / non-private seconds per epoch, medians of the repeats with epochs
interleaved (so that load from other processes hits every trainer alike), in wall-clock and
in process CPU time. Every mode of a model is timed against the same non-private epochs, and
the default mode also with one normal draw per noise coordinate instead of secure mode's
four, a configuration the built-in jobs never use, to show the cost of secure noise alone;
single-pass ghost clipping also with Opacus' own optimizer (secure noise drawn parameter by
parameter, clipped sums copied), to show what drawing the noise at once saves; and with the
draws replaced by zeros written to the same buffers (a diagnostic, no noise at all), to show
what DP-SGD costs besides the normal draws. A second
table splits a step of the single-pass ghost clipping models into its parts (median process
CPU time per step, from whole epochs so that the parts add up to the epoch's time): where
the time of DP-SGD goes; a third times the secure and the one-draw noise alone (one
``SecureNoise.sample`` of the model's size), against the non-private step.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

import numpy as np
import torch
from opacus.optimizers import DPOptimizerFastGradientClipping
from torch.utils.data import DataLoader, TensorDataset

from privsched.jobs.records import read_block_files
from privsched.trainers.dpsgd import (
    Trainer,
    default_mode,
    fit,
    initial_model,
    make_optimizer,
    plain_trainer,
    private_trainer,
    train_heldout,
)
from privsched.trainers.models import build_model
from privsched.trainers.plans import GRAD_SAMPLE_MODES, MODEL_NAMES, DPSGDJob, parse_job
from privsched.trainers.secure_noise import SecureNoise
from workloads.reviews import write_blocks

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
#: The demo's DP-SGD training parameters (``privsched.demo``).
TRAINING = {"lr": 0.05, "optimizer": "adam"}


class ZeroDraws(SecureNoise):
    """Diagnostic only, never a job's noise: the secure noise's buffers written with zeros
    and summed instead of drawn: the same buffers and passes without the normal draws."""

    def sample(self, std: float) -> torch.Tensor:
        self.draws.zero_()
        return torch.sum(self.draws, dim=0, out=self.noise)


def with_noise(trainer: Trainer, source: type[SecureNoise], secure: bool = True) -> Trainer:
    """``trainer`` whose optimizer keeps its noise buffers in a ``source`` (a
    :class:`SecureNoise` or a diagnostic subclass), secure or with one draw."""
    optimizer = trainer.optimizer
    params = optimizer.params
    optimizer.secure_mode = secure
    optimizer._noise = source(sum(p.numel() for p in params), optimizer.generator, params[0].device, params[0].dtype, secure)
    return trainer


def draw_ms(numel: int, device: torch.device, secure: bool, repeats: int) -> float:
    """Median process CPU milliseconds of one draw of ``numel`` coordinates of noise, alone."""
    source = SecureNoise(numel, torch.Generator(device=device).manual_seed(0), device, torch.get_default_dtype(), secure)
    times = []
    for _ in range(10 + repeats):
        start = time.process_time()
        source.sample(1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.process_time() - start)
    return 1e3 * statistics.median(times[10:])


def fit_through(trainer: Trainer, steps: int) -> None:
    """``steps`` steps of ``trainer``, returning once its device has run them all (a GPU
    runs its kernels after the call that queued them returns)."""
    fit(trainer, steps)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)


def epoch_seconds(trainers: list[Trainer], steps: int, repeats: int) -> list[dict[str, float]]:
    """Median time of ``repeats`` epochs of ``steps`` steps of each trainer on each clock, the
    trainers' epochs interleaved (so that load from other processes hits all alike), after
    one warm-up epoch each."""
    for trainer in trainers:
        fit_through(trainer, steps)
    times: list[dict[str, list[float]]] = [{name: [] for name in CLOCKS} for _ in trainers]
    for _ in range(repeats):
        for trainer, measured in zip(trainers, times):
            start = {name: clock() for name, clock in CLOCKS.items()}
            fit_through(trainer, steps)
            for name, clock in CLOCKS.items():
                measured[name].append(clock() - start[name])
    return [{name: statistics.median(values) for name, values in measured.items()} for measured in times]


def per_step_ms(trainers: dict[str, Trainer], steps: int, repeats: int) -> dict[str, dict[str, float]]:
    """Process CPU milliseconds per step of each part of a step, for a non-private trainer
    and single-pass ghost clipping trainers: zeroing the gradients, drawing the batch (and
    moving it to the device), forward and backward (the clipping pass, for DP-SGD), the DP
    optimizer's pre-step (noise, scaling by q·n, the accountant) and the Adam update; and
    "outside", the rest of the epoch (its loop, the clock reads). Each part is its total
    over an epoch divided by the steps, the median of ``repeats`` epochs, so that the parts
    add up to the epoch's time; trainers alternate epoch by epoch, as in
    :func:`epoch_seconds`."""
    clock = time.process_time
    parts: dict[str, dict[str, list[float]]] = {name: {} for name in trainers}
    for _ in range(repeats):
        for name, trainer in trainers.items():
            totals: dict[str, float] = {}
            begin = clock()
            batches = iter(trainer.batches)
            for _ in range(steps):
                start = clock()
                trainer.optimizer.zero_grad(set_to_none=True)
                marks = [("zero_grad", clock())]
                inputs, labels = next(batches)
                inputs, labels = inputs.to(trainer.device), labels.to(trainer.device)
                marks.append(("batch", clock()))
                if trainer.clipping is None:
                    trainer.criterion(trainer.module(inputs), labels).backward()
                    marks.append(("forward, backward", clock()))
                    trainer.optimizer.step()
                else:
                    trainer.clipping.accumulate(inputs, labels)
                    marks.append(("forward, backward", clock()))
                    trainer.optimizer.pre_step()
                    marks.append(("noise, scaling, accountant", clock()))
                    trainer.optimizer.original_optimizer.step()
                marks.append(("Adam", clock()))
                for part, end in marks:
                    totals[part] = totals.get(part, 0.0) + end - start
                    start = end
            totals["outside"] = clock() - begin - sum(totals.values())
            for part, total in totals.items():
                parts[name].setdefault(part, []).append(total / steps)
    return {name: {part: 1e3 * statistics.median(values) for part, values in times.items()} for name, times in parts.items()}


def click_table(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A synthetic events table: eight numeric features in [0, 1), two categorical ones
    (10 and 100 categories) and a binary label that depends on some of them."""
    rng = np.random.default_rng(seed)
    table = {f"x{i}": rng.random(rows) for i in range(8)}
    table["country"] = rng.integers(0, 10, rows)
    table["campaign"] = rng.integers(0, 100, rows)
    score = table["x0"] + table["x1"] - table["x2"] + (table["country"] < 3) - 0.5
    table["clicked"] = (score + 0.3 * rng.standard_normal(rows) > 0.5).astype(np.int64)
    return table


def table_job(rows: int, batch: int, hidden: list[int]) -> DPSGDJob:
    """The built-in tabular MLP job on :func:`click_table` at q = batch / rows."""
    job = parse_job(
        {
            "kind": "dpsgd",
            "model": "mlp",
            "sample_rate": batch / rows,
            "epochs": 1,
            "expected_batch_size": batch,
            "features": [*(f"x{i}" for i in range(8)), "country", "campaign"],
            "label": "clicked",
            "bounds": {f"x{i}": [0, 1] for i in range(8)},
            "categories": {"country": list(range(10)), "campaign": list(range(100))},
            "hidden": hidden,
            **TRAINING,
        }
    )
    assert isinstance(job, DPSGDJob)
    return job


def opacus_hooks(model: torch.nn.Module, train: TensorDataset, job: DPSGDJob, device: torch.device) -> Trainer:
    """Opacus' own path: ``PrivacyEngine.make_private`` with its defaults (per-sample
    gradients from hooks, Poisson sampling by its data loader), σ = 1."""
    from opacus import PrivacyEngine

    model.to(device)
    loader = DataLoader(train, batch_size=int(job.expected_batch_size or 1))
    module, optimizer, loader = PrivacyEngine().make_private(
        module=model, optimizer=make_optimizer(model, job), data_loader=loader, noise_multiplier=1.0, max_grad_norm=job.max_grad_norm
    )
    return Trainer(model, module, optimizer, torch.nn.CrossEntropyLoss(), loader, device)  # type: ignore[arg-type]


def data_parallel(fresh, train: TensorDataset, job: DPSGDJob, steps: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median seconds of an epoch of DP-SGD on one process and on ``args.workers`` (gloo, or
    NCCL with one GPU each on ``--device cuda``), at the same global batch (timed between
    barriers after a warm-up epoch, without the processes' start), and the CPU seconds of
    all the processes together."""
    from privsched.trainers.distributed import train_distributed

    out = {}
    device_type = torch.device(args.device).type
    for workers in (1, args.workers):
        runs = [
            train_distributed(fresh(), train, job, 1.0, steps, args.batch, workers, warmup=steps, device_type=device_type)
            for _ in range(args.repeats)
        ]
        seconds = [ranks[0]["seconds"] for ranks in runs]
        cpu = [sum(rank["cpu"] for rank in ranks) for ranks in runs]
        backend = "NCCL" if device_type == "cuda" else "gloo"
        out[f"DP-SGD on {workers} {backend} process(es)"] = {"wall": statistics.median(seconds), "cpu": statistics.median(cpu)}
    return out


def print_data_parallel(times: dict[str, dict[str, float]], workers: int) -> None:
    """The throughput of ``workers`` processes against one: measured (wall clock), and what
    their CPU time gives on as many idle cores (W · CPU(1) / ΣCPU(W))."""
    one, many = times.values()
    print(
        f"\nthroughput of {workers} processes ÷ 1 at equal global batch: {one['wall'] / many['wall']:.2f}× measured, "
        f"{workers * one['cpu'] / many['cpu']:.2f}× from CPU time on idle cores"
    )


def table(args: argparse.Namespace) -> None:
    """Seconds per epoch of the tabular MLP: non-private, the built-in DP-SGD job's trainer,
    Opacus' ``make_private`` defaults, and ``ctx.dp_sgd``'s trainer on a model the job
    built itself, on the same encoded rows and expected batch."""
    from privsched.trainers.code_training import plan_trainer
    from privsched.trainers.networks import OneHotFeatures

    device = torch.device(args.device)
    hidden = [int(h) for h in args.hidden.split(",")]
    job = table_job(args.rows, args.batch, hidden)
    data, train, _ = train_heldout(click_table(args.rows), job)
    job = job.model_copy(update={"sample_rate": args.batch / len(train)})
    steps = int(1 / job.sample_rate)

    def fresh() -> torch.nn.Module:
        torch.manual_seed(0)
        return initial_model(job, data)

    def users_own() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = [OneHotFeatures(8, [11, 101])]
        widths = [8 + 11 + 101, *hidden]
        for before, after in zip(widths, widths[1:]):
            layers += [torch.nn.Linear(before, after), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 2))

    if args.parallel_only:
        parallel = data_parallel(fresh, train, job, steps, args)
        print(f"{len(train):,} training rows, batch {args.batch}, {steps} steps per epoch, {args.device}, median of {args.repeats}")
        for label, t in parallel.items():
            print(f"{label}: {t['wall']:.3f} s/epoch, {t['cpu']:.3f} CPU s")
        print_data_parallel(parallel, args.workers)
        return
    trainers = {
        "non-private": plain_trainer(fresh(), train, job, device, args.batch),
        "built-in DP-SGD": private_trainer(fresh(), train, job, 1.0, default_mode(fresh()), device, args.batch),
        "Opacus make_private (hooks)": opacus_hooks(fresh(), train, job, device),
        "ctx.dp_sgd": plan_trainer(users_own(), train, job, 1.0, device, args.batch),
    }
    times = dict(zip(trainers, epoch_seconds(list(trainers.values()), steps, args.repeats)))
    parallel = data_parallel(fresh, train, job, steps, args) if args.workers > 1 else {}
    times.update(parallel)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    params = sum(p.numel() for p in trainers["non-private"].model.parameters())
    print(
        f"{len(train):,} training rows of {args.rows:,}, MLP {hidden} ({params:,} parameters), expected batch {args.batch}, "
        f"{steps} steps per epoch, {name}, {torch.get_num_threads()} torch thread(s), median of {args.repeats}\n"
    )
    print("| training | s/epoch | ÷ non-private | CPU-time ÷ non-private | ÷ built-in DP-SGD |")
    print("|---|---:|---:|---:|---:|")
    base, ours = times["non-private"], times["built-in DP-SGD"]
    for label, t in times.items():
        cpu = "—" if math.isnan(t["cpu"]) else f"{t['cpu'] / base['cpu']:.2f}×"
        ratios = f"{t['wall'] / base['wall']:.2f}× | {cpu} | {t['wall'] / ours['wall']:.2f}×"
        print(f"| {label} | {t['wall']:.3f} | {ratios} |")
    if parallel:
        print_data_parallel(parallel, args.workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000, help="synthetic reviews (a fifth held out)")
    parser.add_argument("--sample-rate", type=float, default=0.05, help="Poisson sampling rate q")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a job's CPUs)")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--modes", default=",".join(GRAD_SAMPLE_MODES), help="clipping modes timed besides each model's default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--table", action="store_true", help="time the tabular MLP instead of the review models")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table (a fifth held out)")
    parser.add_argument("--batch", type=int, default=1000, help="the table's expected batch size")
    parser.add_argument("--hidden", default="128,128", help="the table's MLP hidden widths")
    parser.add_argument("--workers", type=int, default=1, help="also time data-parallel DP-SGD on this many gloo processes")
    parser.add_argument("--parallel-only", action="store_true", help="with --table --workers N: time only 1 against N processes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.table:
        table(args)
        return
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        records = read_block_files(write_blocks(tmp, days=1, per_day=args.records, seed=0))
    rows = []
    parts: dict[str, dict[str, dict[str, float]]] = {}
    draws: dict[str, tuple[int, float, float]] = {}
    for model_name in args.models.split(","):
        job = parse_job({"kind": "dpsgd", "model": model_name, "sample_rate": args.sample_rate, "epochs": 1, **TRAINING})
        data, train, _ = train_heldout(records, job)
        steps = int(1 / job.sample_rate)

        def fresh() -> torch.nn.Module:
            torch.manual_seed(0)
            return build_model(model_name, data.vocab_size, data.n_classes)

        default = default_mode(fresh())
        wanted = args.modes.split(",") + [default]
        modes = [mode for mode in GRAD_SAMPLE_MODES if mode in wanted and (mode != "ghost" or default == "ghost")]
        trainers = [plain_trainer(fresh(), train, job, device)]
        trainers += [private_trainer(fresh(), train, job, 1.0, mode, device) for mode in modes]
        insecure = private_trainer(fresh(), train, job, 1.0, default, device)
        insecure.optimizer.secure_mode = False  # benchmark baseline only: one normal draw per noise entry
        baselines = {f"{default}, non-secure noise": insecure}
        if default == "ghost":
            # the same trainer with Opacus' own optimizer class: secure noise drawn parameter by
            # parameter and the clipped sums deep-copied (how jobs ran before the flat draw)
            before = private_trainer(fresh(), train, job, 1.0, default, device)
            before.optimizer.__class__ = DPOptimizerFastGradientClipping
            baselines[f"{default}, Opacus' per-parameter noise"] = before
            baselines[f"{default}, zeros for the draws (diagnostic, no noise)"] = with_noise(
                private_trainer(fresh(), train, job, 1.0, default, device), ZeroDraws
            )
        plain, *private = epoch_seconds(trainers + list(baselines.values()), steps, args.repeats)
        labels = [f"{mode} (default)" if mode == default else mode for mode in modes] + list(baselines)
        rows += [(model_name, label, plain, times) for label, times in zip(labels, private)]
        if default == "ghost":
            secure = trainers[1 + modes.index("ghost")]
            steppers = {"non-private": trainers[0], "DP-SGD": secure, **baselines}
            parts[model_name] = per_step_ms(steppers, steps, args.repeats)
            numel = sum(p.numel() for p in secure.model.parameters())
            draws[model_name] = (numel, draw_ms(numel, device, True, 20 * args.repeats), draw_ms(numel, device, False, 20 * args.repeats))
    batch = args.sample_rate * len(train)
    print(
        f"{len(train)} training reviews, q = {args.sample_rate} (expected batch {batch:.0f}), {steps} steps per "
        f"epoch, device {device}, {torch.get_num_threads()} torch thread(s), median of {args.repeats}\n"
    )
    print("| model | grad-sample mode | non-private s/epoch | DP-SGD s/epoch | ratio | CPU-time ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for model_name, mode, plain, private in rows:
        print(
            f"| {model_name} | {mode} | {plain['wall']:.3f} | {private['wall']:.3f} | "
            f"{private['wall'] / plain['wall']:.2f}× | {private['cpu'] / plain['cpu']:.2f}× |"
        )
    columns = ["zero_grad", "batch", "forward, backward", "noise, scaling, accountant", "Adam", "outside"]
    print(
        "\nCPU ms per step, each part's epoch total / steps, median (single-pass ghost clipping; forward, backward is the clipping pass)\n"
    )
    print(f"| model | training | {' | '.join(columns)} | total | ratio |")
    print("|---|---|" + "---:|" * (len(columns) + 2))
    for model_name, trainers_parts in parts.items():
        base = sum(trainers_parts["non-private"].values())
        for name, times in trainers_parts.items():
            cells = " | ".join(f"{times[c]:.3f}" if c in times else "" for c in columns)
            total = sum(times.values())
            print(f"| {model_name} | {name} | {cells} | {total:.3f} | {total / base:.2f}× |")
    print("\nThe noise alone: one draw of every coordinate, CPU ms, median, against the non-private step above\n")
    print("| model | coordinates | secure (four draws) ms | one draw ms | secure ÷ non-private step | one draw ÷ non-private step |")
    print("|---|---:|---:|---:|---:|---:|")
    for model_name, (numel, secure_ms, one_ms) in draws.items():
        base = sum(parts[model_name]["non-private"].values())
        print(f"| {model_name} | {numel:,} | {secure_ms:.3f} | {one_ms:.3f} | {secure_ms / base:.2f}× | {one_ms / base:.2f}× |")


if __name__ == "__main__":
    main()
