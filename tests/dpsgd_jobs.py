"""Code jobs that train with ``ctx.dp_sgd``, submitted as ``tests.dpsgd_jobs:<name>``.

This module holds no tests: job processes import it. Each job reads its options from
``ctx.params``.
"""

from __future__ import annotations

from torch import nn

from privsched.jobs.context import JobContext
from privsched.trainers.networks import OneHotFeatures, tabular_model

#: The click table's declarations (tests/test_trainers_code_dpsgd.py writes the table).
TABLE = {"bounds": {"amount": [0, 200]}, "categories": {"country": ["fr", "de", "us"]}}


def trains_clicks(ctx: JobContext) -> None:
    """An MLP on the click table, through ``ctx.dp_sgd`` only; says how its model came back."""
    model = tabular_model("mlp", 1, [4], [8], 2)
    trained = ctx.dp_sgd(
        model,
        features=["amount", "country"],
        label="clicked",
        epsilon=ctx.params.get("epsilon"),
        sample_rate=0.1,
        epochs=1,
        lr=0.05,
        **TABLE,
    )
    ctx.report_metrics(returned_its_model=trained is model, reported_spent=None)
    ctx.report_spent([0.0] * ctx.accounting.dims)  # not believed: the supervisor charged the plan


def trains_a_regression_with_its_own_loss(ctx: JobContext) -> None:
    model = nn.Sequential(OneHotFeatures(1, [4]), nn.Linear(5, 1))  # one numeric feature, three countries and unknown
    ctx.dp_sgd(
        model,
        features=["amount", "country"],
        label="spend",
        task="regression",
        sample_rate=0.2,
        epochs=1,
        lr=0.05,
        loss=nn.L1Loss(),
        bounds={"amount": [0, 200], "spend": [0, 100]},
        categories=TABLE["categories"],
    )


def trains_people(ctx: JobContext) -> None:
    """A logistic regression on a person table (tests/test_trainers_person_dpsgd.py), through
    ``ctx.dp_sgd`` only."""
    model = nn.Sequential(nn.Linear(1, 2))
    ctx.dp_sgd(
        model,
        features=["x"],
        label="y",
        sample_rate=0.2,
        epochs=1,
        lr=0.5,
        bounds={"x": [0.0, 1.0]},
        people=60,
    )
