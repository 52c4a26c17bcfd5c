"""Single-pass ghost clipping of models whose trainable layers are all ``nn.Linear``.

Book-keeping ghost clipping (Bu, Wang, Zha & Karypis 2023, "Differentially Private
Optimization on Large Model at Small Cost"): one forward pass keeps each linear layer's
input a (n × d_in) and output z (n × d_out); one backward pass computes only the output
gradients g = ∂(Σ_i L_i)/∂z, whose row i is ∂L_i/∂z_i, and no weight gradient. For a
linear layer on 2-D inputs the per-example weight gradient is the outer product g_i a_iᵀ,
so its squared norm is ‖a_i‖²·‖g_i‖² (Goodfellow 2015; Li et al. 2022), and its bias
gradient is g_i. With the per-example norms N_i over all layers and Opacus' clip factor
c_i = min(1, C / (N_i + 10⁻⁶)), the clipped sum of per-example gradients is one matrix
product per layer, gᵀ diag(c) a, and Σ_i c_i g_i for the bias.

Per person (user-level DP-SGD, :mod:`privsched.trainers.people`): a person's gradient is the
sum over their rows, Σ_{i∈p} g_i a_iᵀ, whose squared norm is Σ_{i,j∈p} (a_i·a_j)(g_i·g_j)
(the Gram identity behind ghost clipping, Li et al. 2022 §4, on a person's ≤ K rows; a bias
adds Σ_{i,j∈p} g_i·g_j), computed from the rows padded per person; each row then takes its
person's clip factor, and the clipped sum is the same matrix product.

Noise, the division by the expected batch size and the privacy accountant are left to the
Opacus optimizer the clipped sum is handed to (``DPOptimizerFastGradientClipping``, as
:class:`privsched.trainers.optimizers.SinglePassGhostOptimizer`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

#: The sum over a batch of per-example losses, from the model's outputs and the labels.
SummedLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: A linear layer's input a (n × d_in) with its output z or its output gradient g (n × d_out).
Pair = tuple[torch.Tensor, torch.Tensor]

#: Opacus' stabiliser in the clip factor C / (N_i + 10⁻⁶) (``get_clipping_coef``).
NORM_EPSILON = 1e-6


def unsupported_layers(model: nn.Module) -> list[str]:
    """The modules with trainable parameters of their own that are not ``nn.Linear``, as
    ``"name (Type)"`` (the root module is named ``model``)."""
    return [
        f"{name or 'model'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if type(module) is not nn.Linear and any(p.requires_grad for p in module.parameters(recurse=False))
    ]


class GhostClipping:
    """Clipped sums of per-example gradients of an all-linear model in one forward and one
    backward pass (Bu et al. 2023).

    ``loss`` maps (outputs, labels) to the *sum* over examples of per-example losses. The
    model must treat examples independently (no batch statistics) and call each linear
    layer once per forward pass on a 2-D input; otherwise a ``ValueError`` says why."""

    def __init__(self, model: nn.Module, max_grad_norm: float, loss: SummedLoss) -> None:
        unsupported = unsupported_layers(model)
        if unsupported:
            raise ValueError(f"single-pass ghost clipping needs trainable layers that are all nn.Linear, not {', '.join(unsupported)}")
        self.model = model
        self.max_grad_norm = max_grad_norm
        self.loss = loss
        self.layers = [m for m in model.modules() if type(m) is nn.Linear and any(p.requires_grad for p in m.parameters())]
        if not self.layers:
            raise ValueError("single-pass ghost clipping needs at least one trainable nn.Linear layer")
        self._captured: dict[nn.Module, Pair] | None = None
        for layer in self.layers:
            layer.register_forward_hook(self._capture)

    def _capture(self, layer: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if self._captured is None:
            return
        if layer in self._captured:
            raise ValueError("single-pass ghost clipping needs each linear layer called once per forward pass")
        if inputs[0].dim() != 2:
            raise ValueError(f"single-pass ghost clipping needs 2-D inputs to linear layers, got {inputs[0].dim()}-D")
        self._captured[layer] = (inputs[0].detach(), output)

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, list[Pair]]:
        """The model's outputs and each trainable layer's (input, output), in ``layers`` order."""
        self._captured = {}
        try:
            outputs = self.model(inputs)
            captured = self._captured
        finally:
            self._captured = None
        if len(captured) != len(self.layers):
            raise ValueError("single-pass ghost clipping needs every trainable linear layer used in the forward pass")
        return outputs, [captured[layer] for layer in self.layers]

    def per_example(
        self, inputs: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[Pair]]:
        """Per-example gradient norms N (n,) and each layer's (a, g): its input and the
        gradient of the summed loss with respect to its output (one backward pass that
        computes no weight gradient). A layer adds ‖g_i‖²·(‖a_i‖² + 1) to N_i² with a
        trainable weight and bias, ‖g_i‖²·‖a_i‖² or ‖g_i‖² with only one of them. With
        ``groups`` (each row's person, 0..p−1), N has one norm per person (module docstring)."""
        outputs, captured = self.forward(inputs)
        total = self.loss(outputs, labels)
        grads = torch.autograd.grad(total, [z for _, z in captured])
        if groups is not None:
            return group_norms(self.layers, [a for a, _ in captured], grads, groups), [(a, g) for (a, _), g in zip(captured, grads)]
        squared = torch.zeros(len(labels), dtype=outputs.dtype, device=outputs.device)
        pairs = []
        for layer, (a, _), g in zip(self.layers, captured, grads):
            g_squared = torch.linalg.vector_norm(g, dim=1).square_()
            if layer.weight.requires_grad:
                a_squared = torch.linalg.vector_norm(a, dim=1).square_()
                if layer.bias is not None and layer.bias.requires_grad:
                    a_squared += 1.0
                squared.addcmul_(a_squared, g_squared)
            elif layer.bias is not None and layer.bias.requires_grad:
                squared += g_squared
            pairs.append((a, g))
        return squared.sqrt_(), pairs

    def clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        """Opacus' clip factors min(1, C / (N_i + 10⁻⁶)), computed as Opacus' ``C / x``
        computes them (torch's reciprocal times C), in place on ``norms``."""
        return norms.add_(NORM_EPSILON).reciprocal_().mul_(self.max_grad_norm).clamp_(max=1.0)

    def accumulate(self, inputs: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """Store the clipped sum of per-example gradients on the batch in each trainable
        parameter's ``grad``: gᵀ diag(c) a for a weight, Σ_i c_i g_i for a bias; with
        ``groups``, c_i is the clip factor of row i's person."""
        norms, pairs = self.per_example(inputs, labels, groups)
        factors = self.clip_factors(norms)
        if groups is not None:
            factors = factors[groups.to(factors.device)]
        factors = factors.unsqueeze(1)
        with torch.no_grad():
            for layer, (a, g) in zip(self.layers, pairs):
                scaled = g * factors
                if layer.weight.requires_grad:
                    layer.weight.grad = scaled.t().mm(a.to(scaled.dtype))
                if layer.bias is not None and layer.bias.requires_grad:
                    layer.bias.grad = scaled.sum(dim=0)


def group_norms(layers: list[nn.Linear], inputs: list[torch.Tensor], grads: tuple[torch.Tensor, ...], groups: torch.Tensor) -> torch.Tensor:
    """The norm of each person's summed gradient over all ``layers`` (p,), from each layer's
    inputs a and output gradients g: Σ_{i,j∈p} (a_i·a_j + [bias])(g_i·g_j) per layer, on the
    rows laid out as (person, rank within person) with zero padding, as batched Gram matrices."""
    device = grads[0].device
    groups = groups.to(device)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    counts = torch.bincount(groups, minlength=n_groups)
    order = torch.argsort(groups, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(groups)
    rank[order] = torch.arange(len(groups), device=device) - starts[groups[order]]
    width = int(counts.max()) if n_groups else 0
    squared = torch.zeros(n_groups, dtype=grads[0].dtype, device=device)

    def padded(rows: torch.Tensor) -> torch.Tensor:
        out = rows.new_zeros((n_groups, width, rows.shape[1]))
        out[groups, rank] = rows
        return out

    for layer, a, g in zip(layers, inputs, grads):
        g_pad = padded(g)
        g_gram = g_pad.bmm(g_pad.transpose(1, 2))
        if layer.weight.requires_grad:
            a_pad = padded(a.to(g.dtype))
            a_gram = a_pad.bmm(a_pad.transpose(1, 2))
            if layer.bias is not None and layer.bias.requires_grad:
                a_gram += 1.0
            squared += (a_gram * g_gram).sum(dim=(1, 2))
        elif layer.bias is not None and layer.bias.requires_grad:
            squared += g_gram.sum(dim=(1, 2))
    return squared.clamp_(min=0).sqrt_()
