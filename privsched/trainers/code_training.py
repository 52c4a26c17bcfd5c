"""``ctx.dp_sgd``: DP-SGD for code jobs, planned and charged by the supervisor.

The job's process asks its supervisor for a training plan (``{"op": "dpsgd_plan"}``,
:meth:`privsched.jobs.primitives.Account._dpsgd_plan`), which computes q, σ and the steps
from what is left of the grant and charges the plan before answering with it and with
read-only descriptors of the granted blocks' files. This process then trains exactly that plan: the built-in
trainer's Poisson sampling on 64-bit draws from OS entropy, Opacus' secure noise from an
OS-seeded generator, on the job's device, with the public batch divisor (the job's
``expected_batch_size``, else q·(the blocks' row count)). On a dataset whose unit is a
person with K > 1 rows, it samples people and clips each person's rows together
(:mod:`privsched.trainers.people`; the divisor the job's ``expected_batch_size``, else
q·its declared ``people``), on the granted blocks' features only. The model is saved as the
pipeline's artifact (``model.pt``, its state dict) and returned. Nothing this process
reports changes the charge; a job that fails after its plan is charged its whole grant.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from privsched.jobs.context import JobContext
from privsched.jobs.records import read_block_files
from privsched.trainers.dpsgd import Trainer, declarations, default_mode, fit, person_column, private_trainer
from privsched.trainers.dpsgd import expected_batch_size as public_divisor
from privsched.trainers.people import people_of
from privsched.trainers.plans import DPSGDJob, check_person_level, parse_job
from privsched.trainers.tabular import encode_rows, resolve_schema


def dp_sgd(
    ctx: JobContext,
    model: nn.Module,
    features: list[str] | None = None,
    label: str | None = None,
    *,
    sample_rate: float,
    epochs: float,
    lr: float,
    epsilon: float | None = None,
    optimizer: str = "adam",
    loss: nn.Module | None = None,
    data: TensorDataset | None = None,
    max_grad_norm: float = 1.0,
    expected_batch_size: int | None = None,
    grad_sample_mode: str | None = None,
    **table: Any,
) -> nn.Module:
    """Train ``model`` privately and return it (module docstring).

    ``features``/``label`` with ``bounds``, ``categories``, ``classes``, ``task`` in
    ``table`` (as a built-in tabular job declares them; the model reads the scaled numeric
    values then the category codes, as :class:`privsched.trainers.networks.OneHotFeatures`
    expects), or ``data``, a dataset of (input, label) tensors the job built. ``loss``: a
    torch loss with a ``reduction`` (default: cross-entropy, or squared error for float
    labels). Bad arguments raise before the plan is asked for, so they cost nothing."""
    if (features is None) == (data is None):
        raise ValueError("ctx.dp_sgd trains on 'features' and a 'label' of the granted blocks, or on 'data'")
    user_column = person_column(ctx)
    if user_column is not None and data is not None:
        raise ValueError(
            "on a dataset whose unit is a person, ctx.dp_sgd trains on 'features' of the granted blocks: 'data' names no person"
        )
    params = {"sample_rate": sample_rate, "epochs": epochs, "lr": lr, "optimizer": optimizer, "max_grad_norm": max_grad_norm}
    if expected_batch_size is not None:
        params["expected_batch_size"] = expected_batch_size
    if features is not None:
        params.update(features=list(features), label=label, **table)
    job = parse_job({"kind": "dpsgd", "model": "logreg", **params})
    assert isinstance(job, DPSGDJob)  # its kind is dpsgd
    schema = resolve_schema(job, declarations(ctx)) if job.tabular else None
    if user_column is not None:
        check_person_level(job)
    plan, files = ctx.channel.dpsgd_plan({"epsilon": epsilon, "sample_rate": sample_rate, "epochs": epochs})
    rows = len(data) if data is not None else 0
    people = None
    try:
        if data is None:
            if user_column is None:
                records = read_block_files(files)
            else:  # one bounded file a block: each block's people apart
                records, units = people_of([read_block_files([file]) for file in files], user_column)
            rows = len(records[job.label_column]) if job.label_column in records else 0
            inputs, labels, kept = encode_rows(records, schema)  # type: ignore[arg-type]
            data = TensorDataset(torch.from_numpy(inputs), torch.from_numpy(labels))
            if user_column is not None:
                people = units[kept]
    finally:
        for file in files:
            file.close()
    divisor = public_divisor(job, rows, people is not None, holdout=0.0)
    device = torch.device(ctx.device)
    trainer = plan_trainer(model, data, job, plan["noise_multiplier"], device, divisor, loss, grad_sample_mode, people)
    fit(trainer, plan["steps"])
    if trainer.history != [(plan["noise_multiplier"], sample_rate, plan["steps"])]:
        raise RuntimeError("the training's accountant did not record the charged plan")
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), ctx.workdir / "model.pt")
    ctx.report_metrics(
        dp_sgd={
            **{k: plan[k] for k in ("sample_rate", "noise_multiplier", "steps")},
            "charge": np.asarray(plan["charge"]).tolist(),
            "epsilon_used": plan["epsilon"],  # at the pipeline's δ
        }
    )
    return model


def plan_trainer(
    model: nn.Module,
    data: TensorDataset,
    job: DPSGDJob,
    sigma: float,
    device: torch.device,
    divisor: int,
    loss: nn.Module | None = None,
    grad_sample_mode: str | None = None,
    people: np.ndarray | None = None,
) -> Trainer:
    """The trainer of a charged plan: the built-in trainer (:func:`private_trainer`) on the
    job's own model and loss, in single-pass ghost clipping where every trainable layer is
    linear, Opacus' ghost clipping elsewhere (Opacus' hooks per person), unless the job names
    a mode; with ``people`` (each row's person), person-level."""
    mode = grad_sample_mode or default_mode(model, people is not None)
    return private_trainer(model, data, job, sigma, mode, device, divisor, loss, people)
