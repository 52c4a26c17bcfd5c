"""The devices a trainer test runs on: the CPU, and a CUDA GPU where there is one. Where
there is none, the CUDA case is reported as skipped, with the reason "no CUDA", rather than
left out of the parametrisation."""

from __future__ import annotations

import pytest
import torch

#: ``@pytest.mark.parametrize("device", DEVICES)``.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
