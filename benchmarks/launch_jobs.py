"""The jobs ``benchmarks/launch.py`` starts (as ``launch_jobs:<name>``, this folder on their
``pythonpath``): each writes the wall-clock time at which its work began to ``started`` in
its work folder. Kept free of privsched imports beyond what the runner already loaded."""

from __future__ import annotations

import time


def statistic(ctx) -> None:
    """The start of a statistic job: its code runs."""
    (ctx.workdir / "started").write_text(repr(time.time()))


def first_dpsgd_step(ctx) -> None:
    """The first DP-SGD step of a logistic regression on 256 synthetic rows with Opacus
    (per-sample clipping at 1.0, noise multiplier 1.0, Poisson sampling at q = 0.25)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    features, labels = torch.randn(256, 32), torch.randint(0, 2, (256,))
    model = torch.nn.Linear(32, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine(secure_mode=False)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=DataLoader(TensorDataset(features, labels), batch_size=64),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    (ctx.workdir / "started").write_text(repr(time.time()))
