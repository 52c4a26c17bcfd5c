"""Opacus' DP optimizers as DP-SGD jobs use them: the clipping, the scaling by the expected
batch size q·n and the accountant's step hook are Opacus' (Yousefpour et al. 2021); the
Gaussian noise is drawn for all parameters in one secure draw per step
(:func:`privsched.trainers.secure_noise.gaussian_noise`, the same N(0, σ²C²) per
coordinate that Opacus' secure mode draws), and under single-pass ghost clipping the
clipped sums are handed over without a copy. Imports Opacus: import this module lazily.
"""

from __future__ import annotations

import torch
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from privsched.trainers.secure_noise import gaussian_noise


class FlatNoise(DPOptimizer):
    """Opacus' ``DPOptimizer`` (per-sample gradients from hooks, flat clipping) whose
    ``add_noise`` draws the step's noise for every parameter at once."""

    def add_noise(self) -> None:
        """``p.grad = p.summed_grad + noise`` for every parameter, the noise N(0, σ²C²) per
        coordinate (Opacus' ``DPOptimizer.add_noise``, with its processed-flag check)."""
        params = self.params
        reference = params[0].summed_grad
        noise = gaussian_noise(
            sum(p.numel() for p in params),
            self.noise_multiplier * self.max_grad_norm,
            self.generator,
            reference.device,
            reference.dtype,
            self.secure_mode,
        )
        for p, entries in zip(params, noise.split([p.numel() for p in params])):
            _check_processed_flag(p.summed_grad)
            p.grad = entries.view_as(p).add_(p.summed_grad)
            _mark_as_processed(p.summed_grad)


class FlatNoiseFastGradientClipping(FlatNoise, DPOptimizerFastGradientClipping):
    """Opacus' optimizer for (two-pass) ghost clipping, whose backward pass leaves the
    clipped sum in ``p.grad``, with :class:`FlatNoise`'s noise."""


class SinglePassGhostOptimizer(FlatNoiseFastGradientClipping):
    """The optimizer of single-pass ghost clipping (:mod:`privsched.trainers.clipping`),
    which assigns each step's clipped sum to ``p.grad`` as a new tensor and never
    accumulates into it: the sum becomes ``p.summed_grad`` as is, where Opacus deep-copies
    it (its copy guards gradients that later backward passes add to in place)."""

    def accumulate(self) -> None:
        for p in self.params:
            p.summed_grad = p.grad


#: The optimizer class of each ``grad_sample_mode``.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "ghost": SinglePassGhostOptimizer,
    "opacus-ghost": FlatNoiseFastGradientClipping,
    "hooks": FlatNoise,
}
