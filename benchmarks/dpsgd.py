"""DP-SGD overhead: time per epoch of private training against non-private training of the
same model on the same synthetic reviews, in one process, for every zoo model and every
Opacus grad-sample mode ("ghost": ghost clipping where the layer has a norm sampler, fast
gradient clipping elsewhere; "hooks": per-sample gradients from hooks).

    .venv/bin/python benchmarks/dpsgd.py [--records 4000] [--sample-rate 0.02] [--repeats 3]

Prints a markdown table; the ratio is private / non-private seconds per epoch (best of the
repeats, epochs interleaved, which discounts interference from other processes).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from privsched.trainers.data import read_block_files
from privsched.trainers.dpsgd import fit, plain_trainer, private_trainer, train_heldout
from privsched.trainers.models import build_model, ghost_clipping_applies
from privsched.trainers.plans import MODEL_NAMES, parse_job
from workloads.reviews import write_blocks


def epoch_seconds(plain, private, steps: int, repeats: int) -> tuple[float, float]:
    """Best wall times of ``repeats`` epochs of ``steps`` steps, non-private and private
    epochs interleaved (so that load from other processes hits both alike), after one
    warm-up epoch each."""
    fit(plain, steps)
    fit(private, steps)
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(repeats):
        for index, trainer in enumerate((plain, private)):
            start = time.perf_counter()
            fit(trainer, steps)
            times[index].append(time.perf_counter() - start)
    return min(times[0]), min(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000, help="synthetic reviews (a fifth held out)")
    parser.add_argument("--sample-rate", type=float, default=0.02, help="Poisson sampling rate q")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        records = read_block_files(write_blocks(tmp, days=1, per_day=args.records, seed=0))
    rows = []
    for model_name in args.models.split(","):
        job = parse_job({"kind": "dpsgd", "model": model_name, "sample_rate": args.sample_rate, "epochs": 1, "lr": 0.01})
        data, train, _ = train_heldout(records, job)
        steps = int(1 / job.sample_rate)

        def fresh() -> torch.nn.Module:
            torch.manual_seed(0)
            return build_model(model_name, data.vocab_size, data.n_classes)

        default = "ghost" if ghost_clipping_applies(fresh()) else "hooks"
        for mode in ("ghost", "hooks"):
            plain, private = epoch_seconds(
                plain_trainer(fresh(), train, job, device),
                private_trainer(fresh(), train, job, 1.0, mode, device),
                steps,
                args.repeats,
            )
            label = f"{mode} (default)" if mode == default else mode
            rows.append((model_name, label, plain, private, private / plain))
    print(f"{len(train)} training reviews, q = {args.sample_rate}, {steps} steps per epoch, device {device}, "
          f"{torch.get_num_threads()} torch threads\n")
    print("| model | grad-sample mode | non-private s/epoch | DP-SGD s/epoch | ratio |")
    print("|---|---|---:|---:|---:|")
    for model_name, mode, plain, private, ratio in rows:
        print(f"| {model_name} | {mode} | {plain:.3f} | {private:.3f} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
