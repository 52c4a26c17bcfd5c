"""Models built from declarations: a table's ``logreg`` and ``mlp``, and layer lists
(:mod:`privsched.trainers.layers`), with their sizes taken from the job and the schema
only. Every model is checked by Opacus' ``ModuleValidator`` before it trains.

A table's categorical features are one-hot coded inside the model, batch by batch, and go
into its first linear layer with the numeric ones: that layer's columns are the categories'
embeddings, and a model of linear layers stays all-linear, so single-pass ghost clipping
(:mod:`privsched.trainers.clipping`) computes its per-example norms in closed form.
"""

from __future__ import annotations

import torch
from torch import nn

from privsched.trainers.layers import LayerModel
from privsched.trainers.models import perceptron

#: Token sequence lengths a layer model is tried on: its output must not depend on them.
TRIAL_LENGTHS = (7, 12)


class OneHotFeatures(nn.Module):
    """Encoded features (n, k_num + k_cat): numeric values kept, category codes one-hot."""

    offsets: torch.Tensor  # a buffer: each category's first column among the one-hot ones

    def __init__(self, n_numeric: int, category_sizes: list[int]) -> None:
        super().__init__()
        self.n_numeric = n_numeric
        self.width = sum(category_sizes)
        offsets = torch.tensor([0, *category_sizes[:-1]], dtype=torch.long).cumsum(0) if category_sizes else torch.zeros(0)
        self.register_buffer("offsets", offsets.long(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        numeric = x[:, : self.n_numeric]
        if self.width == 0:
            return numeric
        index = x[:, self.n_numeric :].long() + self.offsets
        onehot = torch.zeros(len(x), self.width, dtype=x.dtype, device=x.device).scatter_(1, index, 1.0)
        return torch.cat([numeric, onehot], dim=1)


class ChannelsFirst(nn.Module):
    """(n, L, d) to (n, d, L), as convolutions read a sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class GlobalPool(nn.Module):
    """Max or mean over every dimension after the channels: (n, c, ...) to (n, c)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(2)
        return flat.amax(dim=2) if self.how == "maxpool" else flat.mean(dim=2)


class SquaredError(nn.Module):
    """(output − target)² per example, a regression head's loss; ``reduction`` as torch's
    losses read it ("mean", "sum" or "none"), so that Opacus' loss wrappers can set it."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        per_example = (output - target).square().sum(dim=1)
        if self.reduction == "none":
            return per_example
        return per_example.sum() if self.reduction == "sum" else per_example.mean()


def tabular_model(name: str, n_numeric: int, category_sizes: list[int], hidden: list[int], n_outputs: int) -> nn.Module:
    """``logreg`` (one linear layer) or ``mlp`` (``hidden`` widths) on encoded features."""
    encoder = OneHotFeatures(n_numeric, category_sizes)
    width = n_numeric + sum(category_sizes)
    return nn.Sequential(encoder, *perceptron(width, [] if name == "logreg" else hidden, n_outputs))


def _layer(spec, x: torch.Tensor, vocab_size: int | None) -> nn.Module:
    """The module of one declared layer, sized from ``x``, the output of the layers before."""
    kind = spec.type
    if kind == "linear":
        if x.dim() != 2:
            raise ValueError("a linear layer needs flat input: put maxpool, meanpool or flatten before it")
        return nn.Linear(x.shape[1], spec.out)
    if kind == "embedding":
        if vocab_size is None or x.dtype != torch.long:
            raise ValueError("an embedding layer reads token ids and comes first")
        return nn.Sequential(nn.Embedding(vocab_size, spec.dim, padding_idx=0), ChannelsFirst())
    if kind in ("conv1d", "conv2d"):
        dims = 3 if kind == "conv1d" else 4
        if x.dim() != dims:
            raise ValueError(f"a {kind} layer needs input of {dims - 2} spatial dimension(s) after the channels, got {x.dim() - 2}")
        conv = nn.Conv1d if kind == "conv1d" else nn.Conv2d
        return conv(x.shape[1], spec.out, spec.kernel, padding=spec.padding)
    if kind == "reshape":
        if x.dim() != 2 or x.shape[1] != int(torch.tensor(spec.shape).prod()):
            raise ValueError(f"cannot reshape {x.shape[1:].numel()} values to {spec.shape}")
        return nn.Unflatten(1, tuple(spec.shape))
    if kind == "groupnorm":
        if x.dim() < 2 or x.shape[1] % spec.groups:
            raise ValueError(f"groupnorm: {spec.groups} groups do not divide {x.shape[1] if x.dim() > 1 else 0} channels")
        return nn.GroupNorm(spec.groups, x.shape[1])
    if kind == "layernorm":
        return nn.LayerNorm(x.shape[-1])
    if kind == "dropout":
        return nn.Dropout(spec.p)
    if kind in ("maxpool", "meanpool"):
        if x.dim() < 3:
            raise ValueError(f"{kind} pools over the dimensions after the channels: its input has none")
        return GlobalPool(kind)
    if kind == "flatten":
        return nn.Flatten()
    return {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}[kind]()


def layer_model(spec: LayerModel, first: nn.Module | None, trial: torch.Tensor, n_outputs: int, vocab_size: int | None) -> nn.Module:
    """The declared layers after ``first`` (a table's encoder, or nothing before token ids),
    then the head ``Linear(·, n_outputs)``. Each layer is sized by passing ``trial``, a
    public dummy batch (zeros), through the layers before it; on token ids the model must
    give the same output shape at every sequence length. Raises a one-line ``ValueError``."""
    try:
        return _sized_layers(spec, first, trial, n_outputs, vocab_size)
    except RuntimeError as exc:  # torch's own shape errors
        raise ValueError(f"the layers do not fit together: {str(exc).splitlines()[0]}") from None


def _sized_layers(spec: LayerModel, first: nn.Module | None, trial: torch.Tensor, n_outputs: int, vocab_size: int | None) -> nn.Module:
    modules: list[nn.Module] = [] if first is None else [first]
    x = trial if first is None else first(trial)
    with torch.no_grad():
        for layer in spec.layers:
            module = _layer(layer, x, vocab_size)
            modules.append(module)
            module.eval()
            x = module(x)
        if x.dim() != 2:
            raise ValueError("the last layer must give flat output (add maxpool, meanpool or flatten)")
        modules.append(nn.Linear(x.shape[1], n_outputs))
        model = nn.Sequential(*modules)
        if first is None:
            model.eval()
            shapes = {model(torch.zeros(2, length, dtype=torch.long)).shape for length in TRIAL_LENGTHS}
            if len(shapes) != 1:
                raise ValueError("the model's output depends on the sequence length: pool (maxpool, meanpool) before flattening")
    return model.train()


def check_private(model: nn.Module) -> None:
    """Opacus' ``ModuleValidator``: the model has no layer DP-SGD cannot clip per example
    (batch norm, for one). Raises a one-line ``ValueError`` naming the first problem."""
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"Opacus cannot train this model privately: {str(errors[0]).splitlines()[0]}")
