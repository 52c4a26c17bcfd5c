"""Opacus' DP optimizers as DP-SGD jobs use them: the clipping, the scaling by the expected
batch size q·n and the accountant's step hook are Opacus' (Yousefpour et al. 2021); the
Gaussian noise is drawn for all parameters in one secure draw per step into buffers kept
from step to step (:class:`privsched.trainers.secure_noise.SecureNoise`, the same
N(0, σ²C²) per coordinate that Opacus' secure mode draws), the noisy sums of all
parameters lie side by side in one buffer that is scaled in one operation, and under
single-pass ghost clipping the clipped sums are handed over without a copy. The
arithmetic per coordinate is Opacus' (``DPOptimizer.add_noise`` then ``scale_grad``):
(clipped sum + noise) / (q·n), so the released gradient, and with it the charged
mechanism, is unchanged. Imports Opacus: import this module lazily.
"""

from __future__ import annotations

import torch
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from privsched.trainers.secure_noise import SecureNoise


class FlatNoise(DPOptimizer):
    """Opacus' ``DPOptimizer`` (per-sample gradients from hooks, flat clipping) whose
    ``add_noise`` draws the step's noise for every parameter at once. After a step each
    ``p.grad`` is a view of one buffer that the next step overwrites."""

    _noise: SecureNoise | None = None

    def noise_source(self, numel: int, reference: torch.Tensor) -> SecureNoise:
        """The kept noise buffers, made anew when the model's size, device or type or the
        secure mode changed."""
        if self._noise is None or not self._noise.fits(numel, reference.device, reference.dtype, self.secure_mode):
            self._noise = SecureNoise(numel, self.generator, reference.device, reference.dtype, self.secure_mode)
        return self._noise

    def add_noise(self) -> None:
        """``p.grad = p.summed_grad + noise`` for every parameter, the noise N(0, σ²C²) per
        coordinate (Opacus' ``DPOptimizer.add_noise``, with its processed-flag check)."""
        params = self.params
        sizes = [p.numel() for p in params]
        source = self.noise_source(sum(sizes), params[0].summed_grad)
        noise = source.sample(self.noise_multiplier * self.max_grad_norm)
        for p, entries in zip(params, noise.split(sizes)):
            _check_processed_flag(p.summed_grad)
            p.grad = entries.view_as(p).add_(p.summed_grad)
            _mark_as_processed(p.summed_grad)

    def scale_grad(self) -> None:
        """Opacus' ``scale_grad``, ``p.grad /= q·n`` under ``loss_reduction="mean"``, as one
        division of the buffer in which :meth:`add_noise` left every ``p.grad``."""
        if self.loss_reduction == "mean" and self._noise is not None:
            self._noise.noise.div_(self.expected_batch_size * self.accumulated_iterations)


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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the last step's gradients and clipped sums. Since the clipping pass
        assigns every gradient anew, setting them to ``None`` is all a step needs, without
        the wrapped optimizer's own ``zero_grad`` (zeroing in place otherwise)."""
        if not set_to_none:
            super().zero_grad(set_to_none)
            return
        for p in self.params:
            p.grad = None
            p.summed_grad = None


#: The optimizer class of each ``grad_sample_mode``.
OPTIMIZERS: dict[str, type[DPOptimizer]] = {
    "ghost": SinglePassGhostOptimizer,
    "opacus-ghost": FlatNoiseFastGradientClipping,
    "hooks": FlatNoise,
}
