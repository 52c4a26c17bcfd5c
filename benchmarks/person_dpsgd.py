"""Person-level DP-SGD against record-level DP-SGD: process CPU seconds per epoch of the same
tabular MLP on the same rows, Poisson sampling over people (each person's K rows summed and
clipped together, :mod:`privsched.trainers.people`) against sampling over rows, in
single-pass ghost clipping and in Opacus' hooks mode.

    .venv/bin/python benchmarks/person_dpsgd.py [--rows 50000] [--k 4] [--batch 1000] [--repeats 3]

``--rows`` rows of ``rows / k`` people with ``k`` rows each; record-level batches expect
``--batch`` rows, person-level ones ``--batch / k`` people (the same rows a step). Epochs are
interleaved (load from other processes hits every trainer alike); medians are printed as a
markdown table with the ratio person / record.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from torch.utils.data import TensorDataset

from privsched.trainers.dpsgd import fit, private_trainer
from privsched.trainers.networks import tabular_model
from privsched.trainers.plans import parse_job


def trainer(mode: str, data: TensorDataset, people: np.ndarray | None, args: argparse.Namespace):
    """A private trainer of a fresh MLP, over people when ``people`` is given."""
    rows = len(data.tensors[0])
    units = rows // args.k if people is not None else rows
    batch = args.batch // args.k if people is not None else args.batch
    job = parse_job({"kind": "dpsgd", "model": "mlp", "sample_rate": batch / units, "epochs": 1, "lr": 0.05, "optimizer": "adam"})
    torch.manual_seed(0)
    model = tabular_model("mlp", 8, [], [128, 128], 2)
    return private_trainer(model, data, job, 1.0, mode, torch.device("cpu"), batch, people=people)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--k", type=int, default=4, help="rows of each person")
    parser.add_argument("--batch", type=int, default=1000, help="expected rows a step")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    inputs = torch.from_numpy(rng.uniform(0, 1, (args.rows, 8)).astype(np.float32))
    labels = (inputs[:, 0] > 0.5).long()
    data = TensorDataset(inputs, labels)
    people = rng.permutation(np.repeat(np.arange(args.rows // args.k), args.k))[: args.rows]
    keys = [(mode, unit) for mode in ("ghost", "hooks") for unit in ("record", "person")]
    trainers = {(mode, unit): trainer(mode, data, people if unit == "person" else None, args) for mode, unit in keys}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in trainers}
    for _ in range(args.repeats):
        for key, each in trainers.items():
            start = time.process_time()
            fit(each, len(each.batches))
            times[key].append(time.process_time() - start)
    print(f"{args.rows:,} rows, {args.rows // args.k:,} people of {args.k} rows, about {args.batch} rows a step\n")
    print("| mode | record s/epoch | person s/epoch | person / record |")
    print("|---|---|---|---|")
    for mode in ("ghost", "hooks"):
        record, person = statistics.median(times[(mode, "record")]), statistics.median(times[(mode, "person")])
        print(f"| {mode} | {record:.2f} | {person:.2f} | {person / record:.2f}× |")


if __name__ == "__main__":
    main()
