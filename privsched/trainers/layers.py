"""Declarative models: ``model: {layers: [...]}``, a list of layers a submitter writes
without code, checked at submit (no torch imported) and built by privsched
(:func:`privsched.trainers.models.layer_model`), where Opacus' ``ModuleValidator`` checks
that DP-SGD can train it.

Each layer is a mapping with its ``type`` and its sizes::

    model:
      layers:
        - {type: embedding, dim: 32}          # token ids -> (channels, length)
        - {type: conv1d, out: 64, kernel: 3}
        - {type: relu}
        - {type: maxpool}                     # global pooling over the length
        - {type: linear, out: 32}
        - {type: dropout, p: 0.1}

The input sizes of each layer follow from the job's inputs (declared features, the declared
vocabulary), never from the data; privsched appends the head (a linear layer to the classes,
or to one output for regression). Batch normalisation mixes the examples of a batch, so that
no per-example gradient exists: it is refused, with group or layer normalisation named instead.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

#: Largest width of any layer, and most layers of a model.
MAX_WIDTH, MAX_LAYERS = 65_536, 64


class _Layer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Linear(_Layer):
    type: Literal["linear"]
    out: int = Field(ge=1, le=MAX_WIDTH)


class Embedding(_Layer):
    """Token ids (n, L) to (n, dim, L), channels first as convolutions read them."""

    type: Literal["embedding"]
    dim: int = Field(ge=1, le=MAX_WIDTH)


class Conv1d(_Layer):
    type: Literal["conv1d"]
    out: int = Field(ge=1, le=MAX_WIDTH)
    kernel: int = Field(3, ge=1, le=64)
    padding: int = Field(0, ge=0, le=64)


class Conv2d(_Layer):
    type: Literal["conv2d"]
    out: int = Field(ge=1, le=MAX_WIDTH)
    kernel: int = Field(3, ge=1, le=64)
    padding: int = Field(0, ge=0, le=64)


class Reshape(_Layer):
    """A flat vector to (channels, height, width) for a 2-D convolution."""

    type: Literal["reshape"]
    shape: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] = Field(min_length=1, max_length=3)


class GroupNorm(_Layer):
    type: Literal["groupnorm"]
    groups: int = Field(ge=1, le=MAX_WIDTH)


class LayerNorm(_Layer):
    """Normalises each example over its last dimension."""

    type: Literal["layernorm"]


class Activation(_Layer):
    type: Literal["relu", "tanh", "gelu", "sigmoid"]


class Dropout(_Layer):
    type: Literal["dropout"]
    p: float = Field(0.1, ge=0, lt=1)


class Pool(_Layer):
    """Global max or mean over every dimension after the channels, then flat."""

    type: Literal["maxpool", "meanpool"]


class Flatten(_Layer):
    type: Literal["flatten"]


def _refuse_batch_norm(value: object) -> object:
    if isinstance(value, dict) and str(value.get("type", "")).lower().startswith("batchnorm"):
        raise ValueError("batch norm mixes the examples of a batch, so DP-SGD cannot clip per example: use groupnorm or layernorm")
    return value


Layer = Annotated[
    Union[Linear, Embedding, Conv1d, Conv2d, Reshape, GroupNorm, LayerNorm, Activation, Dropout, Pool, Flatten],
    Field(discriminator="type"),
    BeforeValidator(_refuse_batch_norm),
]


class LayerModel(BaseModel):
    """A model given as its list of layers (the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: list[Layer] = Field(min_length=1, max_length=MAX_LAYERS)
