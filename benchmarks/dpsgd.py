"""DP-SGD overhead: time per epoch of private training against non-private training of the
same model on the same synthetic reviews, in one process, for every zoo model and every
clipping mode that applies to it ("ghost": single-pass ghost clipping, all-linear models
only; "opacus-ghost": Opacus' two-pass ghost clipping where a layer has a norm sampler, fast
gradient clipping elsewhere; "hooks": Opacus' per-sample gradients from hooks).

    .venv/bin/python benchmarks/dpsgd.py [--records 10000] [--sample-rate 0.05] [--threads 1]

The defaults are how the built-in jobs run: the demo's DP-SGD pipelines train with Adam at
q = 0.05 on about ten daily blocks of 1,000 reviews (8,000 training reviews, batches of
about 400), in a process the executor gives one CPU (``OMP_NUM_THREADS=1``). Prints a markdown table;
the ratio is private / non-private seconds per epoch, best of the repeats with epochs
interleaved (which discounts interference from other processes), in wall-clock and in
process CPU time. Every mode of a model is timed against the same non-private epochs, and
the default mode also with Opacus' plain (non-secure) noise sampling, a configuration the
built-in jobs never use, to show the cost of secure noise alone.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from privsched.jobs.records import read_block_files
from privsched.trainers.dpsgd import Trainer, default_mode, fit, plain_trainer, private_trainer, train_heldout
from privsched.trainers.models import build_model
from privsched.trainers.plans import GRAD_SAMPLE_MODES, MODEL_NAMES, parse_job
from workloads.reviews import write_blocks

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
#: The demo's DP-SGD training parameters (``privsched.demo``).
TRAINING = {"lr": 0.05, "optimizer": "adam"}


def epoch_seconds(trainers: list[Trainer], steps: int, repeats: int) -> list[dict[str, float]]:
    """Best time of ``repeats`` epochs of ``steps`` steps of each trainer on each clock, the
    trainers' epochs interleaved (so that load from other processes hits all alike), after
    one warm-up epoch each."""
    for trainer in trainers:
        fit(trainer, steps)
    times: list[dict[str, list[float]]] = [{name: [] for name in CLOCKS} for _ in trainers]
    for _ in range(repeats):
        for trainer, measured in zip(trainers, times):
            start = {name: clock() for name, clock in CLOCKS.items()}
            fit(trainer, steps)
            for name, clock in CLOCKS.items():
                measured[name].append(clock() - start[name])
    return [{name: min(values) for name, values in measured.items()} for measured in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000, help="synthetic reviews (a fifth held out)")
    parser.add_argument("--sample-rate", type=float, default=0.05, help="Poisson sampling rate q")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a job's CPUs)")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        records = read_block_files(write_blocks(tmp, days=1, per_day=args.records, seed=0))
    rows = []
    for model_name in args.models.split(","):
        job = parse_job({"kind": "dpsgd", "model": model_name, "sample_rate": args.sample_rate, "epochs": 1, **TRAINING})
        data, train, _ = train_heldout(records, job)
        steps = int(1 / job.sample_rate)

        def fresh() -> torch.nn.Module:
            torch.manual_seed(0)
            return build_model(model_name, data.vocab_size, data.n_classes)

        default = default_mode(fresh())
        modes = [mode for mode in GRAD_SAMPLE_MODES if mode != "ghost" or default == "ghost"]
        trainers = [plain_trainer(fresh(), train, job, device)]
        trainers += [private_trainer(fresh(), train, job, 1.0, mode, device) for mode in modes]
        insecure = private_trainer(fresh(), train, job, 1.0, default, device)
        insecure.optimizer.secure_mode = False  # benchmark baseline only: one normal draw per noise entry
        plain, *private, plain_noise = epoch_seconds(trainers + [insecure], steps, args.repeats)
        for mode, times in zip(modes, private):
            label = f"{mode} (default)" if mode == default else mode
            rows.append((model_name, label, plain, times))
        rows.append((model_name, f"{default}, non-secure noise", plain, plain_noise))
    batch = args.sample_rate * len(train)
    print(f"{len(train)} training reviews, q = {args.sample_rate} (expected batch {batch:.0f}), {steps} steps per "
          f"epoch, device {device}, {torch.get_num_threads()} torch thread(s), best of {args.repeats}\n")
    print("| model | grad-sample mode | non-private s/epoch | DP-SGD s/epoch | ratio | CPU-time ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for model_name, mode, plain, private in rows:
        print(f"| {model_name} | {mode} | {plain['wall']:.3f} | {private['wall']:.3f} | "
              f"{private['wall'] / plain['wall']:.2f}× | {private['cpu'] / plain['cpu']:.2f}× |")


if __name__ == "__main__":
    main()
