"""DP-SGD's Gaussian noise for all parameters in one draw per step, secure against
floating-point attacks.

DP-SGD adds independent N(0, σ²C²) noise to every coordinate of the clipped gradient sum
(Abadi et al. 2016, Algorithm 1). Opacus' ``secure_mode`` makes each coordinate the sum of
2n = 4 independent draws of N(0, σ²C²) divided by √(2n) = 2, itself N(0, σ²C²), so that
the floating-point value of the noise no longer reveals which inputs could have produced
it (Holohan & Braghin 2021 §5.1, with n = 2 as in Opacus 1.6's ``_generate_noise``).

Opacus draws that noise parameter by parameter, four tensors each. :func:`gaussian_noise`
draws the same 4·P standard normals for all P coordinates of the model at once, with the
same sampler (torch's, on the given generator), and sums them the same way: every
coordinate is still the scaled sum of four independent draws, independent of every other
coordinate, so the noise, and with it the subsampled Gaussian mechanism the plan was
charged for, is unchanged; only the number of tensor operations per step drops (one draw,
one sum, one scaling, instead of about five operations per draw and parameter).
"""

from __future__ import annotations

import math

import torch

#: Normal draws summed per coordinate: 2n with Opacus' n = 2 (Holohan & Braghin 2021 §5.1).
SECURE_DRAWS = 4


def gaussian_noise(
    numel: int, std: float, generator: torch.Generator, device: torch.device, dtype: torch.dtype, secure: bool = True
) -> torch.Tensor:
    """``numel`` independent N(0, std²) entries on ``device``: each the sum of
    :data:`SECURE_DRAWS` standard normal draws from ``generator`` times std/√4 = std/2
    (secure mode), or one draw times std when ``secure`` is false (never for a job)."""
    draws = SECURE_DRAWS if secure else 1
    normals = torch.randn(draws, numel, generator=generator, device=device, dtype=dtype)
    return normals.sum(dim=0).mul_(std / math.sqrt(draws))
