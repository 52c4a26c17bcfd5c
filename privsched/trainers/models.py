"""The model zoo: small review classifiers that train on 2 CPU cores (OSDI'21 §6.2 uses a
linear model, a feed-forward network, an LSTM and a small BERT on Amazon Reviews).

- ``logreg``: logistic regression on bag-of-words features.
- ``mlp``: one hidden layer on bag-of-words features.
- ``cnn``: token embeddings, a width-3 1-D convolution, max-pooling over time.
- ``text``: embedding-bag classifier, the mean of the review's token embeddings and a
  linear head. The mean is taken as a product with the review's token frequencies, so the
  embedding table is an ``nn.Linear`` whose per-sample gradient norms ghost clipping
  computes in closed form.
- ``lstm``: token embeddings and an Opacus ``DPLSTM``, mean-pooled over the review.

``logreg``, ``mlp`` and ``text`` contain only linear layers and train with single-pass
ghost clipping (``grad_sample_mode="ghost"``); ``cnn`` (embedding, convolution) and
``lstm`` (embedding, recurrent cells) train with Opacus' two-pass ghost clipping, whose
norms come from per-sample gradients for those layers.
"""

from __future__ import annotations

import torch
from torch import nn

from privsched.trainers.clipping import unsupported_layers

#: Which input a model reads: bag-of-words features or token ids.
INPUTS = {"logreg": "bow", "mlp": "bow", "cnn": "tokens", "text": "tokens", "lstm": "tokens"}


class LogReg(nn.Module):
    def __init__(self, vocab_size: int, n_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vocab_size, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class MLP(nn.Module):
    """Linear layers of the ``hidden`` widths with ReLUs between them, then the head."""

    def __init__(self, vocab_size: int, n_classes: int, hidden: int | list[int]) -> None:
        super().__init__()
        self.net = nn.Sequential(*perceptron(vocab_size, [hidden] if isinstance(hidden, int) else hidden, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _masked_mean(h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean of ``h`` (n, L, d) over the non-padding positions of ``tokens`` (n, L)."""
    mask = (tokens > 0).unsqueeze(-1).to(h.dtype)
    return (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class TextCNN(nn.Module):
    def __init__(self, vocab_size: int, n_classes: int, embed_dim: int, hidden: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.conv = nn.Conv1d(embed_dim, hidden, kernel_size=3, padding=1)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(self.embedding(tokens).transpose(1, 2)))
        return self.out(h.amax(dim=2))


def token_frequencies(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Each review's token frequencies (n, vocab_size): counts of its non-padding tokens
    divided by their number, so that ``frequencies @ E`` is the mean of its embeddings."""
    mask = (tokens > 0).to(torch.float32)
    weights = mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return torch.zeros(len(tokens), vocab_size, device=tokens.device).scatter_add_(1, tokens.long(), weights)


class EmbeddingBagClassifier(nn.Module):
    """Mean of token embeddings, then a linear head (an ``EmbeddingBag(mode="mean")``
    classifier with padding id 0 left out).

    The embedding table is the weight of ``nn.Linear(vocab_size, embed_dim, bias=False)``
    applied to token frequencies f: one review's gradient is ``g fᵀ``, whose norm
    ``‖g‖·‖f‖`` is what ghost clipping computes for a linear layer (Li et al. 2022),
    with no per-token gathering. Its columns start N(0, 1) like ``nn.Embedding`` rows."""

    def __init__(self, vocab_size: int, n_classes: int, embed_dim: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Linear(vocab_size, embed_dim, bias=False)
        nn.init.normal_(self.embedding.weight)
        self.out = nn.Linear(embed_dim, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embedding(token_frequencies(tokens, self.vocab_size)))


class LSTMClassifier(nn.Module):
    def __init__(self, vocab_size: int, n_classes: int, embed_dim: int, hidden: int) -> None:
        super().__init__()
        from opacus.layers import DPLSTM

        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = DPLSTM(embed_dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embedding(tokens))
        return self.out(_masked_mean(h, tokens))


def perceptron(n_inputs: int, hidden: list[int], n_outputs: int) -> list[nn.Module]:
    """Linear layers through the ``hidden`` widths, ReLU between them."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(n_inputs, width), nn.ReLU()]
        n_inputs = width
    return [*layers, nn.Linear(n_inputs, n_outputs)]


def build_model(name: str, vocab_size: int, n_classes: int, embed_dim: int = 32, hidden: int | list[int] = 64) -> nn.Module:
    """A fresh model of the zoo (seed torch first for reproducible weights)."""
    if name == "logreg":
        return LogReg(vocab_size, n_classes)
    if name == "mlp":
        return MLP(vocab_size, n_classes, hidden)
    hidden = hidden if isinstance(hidden, int) else hidden[0]
    if name == "cnn":
        return TextCNN(vocab_size, n_classes, embed_dim, hidden)
    if name == "text":
        return EmbeddingBagClassifier(vocab_size, n_classes, embed_dim)
    if name == "lstm":
        return LSTMClassifier(vocab_size, n_classes, embed_dim, hidden)
    raise ValueError(f"unknown model {name!r} (expected one of {', '.join(INPUTS)})")


def ghost_clipping_applies(model: nn.Module) -> bool:
    """Whether every trainable layer is an ``nn.Linear``, so that single-pass ghost clipping
    (:mod:`privsched.trainers.clipping`; Bu et al. 2023) computes its per-sample gradient
    norms in closed form and never materialises per-sample gradients."""
    return not unsupported_layers(model)
