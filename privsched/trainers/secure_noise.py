"""DP-SGD's Gaussian noise for all parameters in one draw per step, secure against
floating-point attacks, in buffers reused from step to step.

DP-SGD adds independent N(0, σ²C²) noise to every coordinate of the clipped gradient sum
(Abadi et al. 2016, Algorithm 1). Opacus' ``secure_mode`` makes each coordinate the sum of
2n = 4 independent draws of N(0, σ²C²) divided by √(2n) = 2, itself N(0, σ²C²), so that
the floating-point value of the noise no longer reveals which inputs could have produced
it (Holohan & Braghin 2021 §5.1, with n = 2 as in Opacus 1.6's ``_generate_noise``).

Opacus draws that noise parameter by parameter, four tensors each, and halves their sum.
:class:`SecureNoise` draws the 4·P normals for all P coordinates of the model at once, with
the same sampler (torch's ``normal_``, on the given generator), each of standard deviation
σC/2 (the sampler scales its Box-Muller output, so halving costs no pass of its own), and
sums them. Halving a float is exact (short of underflow), so a coordinate is, bit for bit,
Opacus' sum of its four draws of N(0, σ²C²) halved: still N(0, σ²C²), the sum of four
independent draws, independent of every other coordinate and of every earlier step (each step
overwrites the whole buffer with new draws from the generator), so the noise, and with it
the subsampled Gaussian mechanism the plan was charged for, is unchanged; only the number
of tensor operations and allocations per step drops (one draw into a kept buffer, one sum
into another).
"""

from __future__ import annotations

import math

import torch

#: Normal draws summed per coordinate: 2n with Opacus' n = 2 (Holohan & Braghin 2021 §5.1).
SECURE_DRAWS = 4


class SecureNoise:
    """``numel`` coordinates of Gaussian noise on ``device``, redrawn at every
    :meth:`sample` into the same buffers: each coordinate the sum of :data:`SECURE_DRAWS`
    draws of N(0, (std/√4)²) = N(0, (std/2)²) from ``generator`` (secure mode), or one
    draw of N(0, std²) when ``secure`` is false (a benchmark baseline, never a job)."""

    def __init__(self, numel: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype, secure: bool = True) -> None:
        self.generator = generator
        self.secure = secure
        self.draws = torch.empty(SECURE_DRAWS if secure else 1, numel, device=device, dtype=dtype)
        self.noise = torch.empty(numel, device=device, dtype=dtype)

    def fits(self, numel: int, device: torch.device, dtype: torch.dtype, secure: bool) -> bool:
        """Whether these buffers serve noise of this size, place, type and kind."""
        return (self.noise.numel(), self.noise.device, self.noise.dtype, self.secure) == (numel, device, dtype, secure)

    def sample(self, std: float) -> torch.Tensor:
        """Fresh N(0, std²) noise in :attr:`noise`, the buffer the next call overwrites."""
        self.draws.normal_(0.0, std / math.sqrt(len(self.draws)), generator=self.generator)
        return torch.sum(self.draws, dim=0, out=self.noise)
