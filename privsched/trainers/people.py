"""Person-level DP-SGD: Poisson sampling over people, each person's rows clipped together.

User-level DP-SGD (McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018, Alg. 1 with the fixed-denominator estimator and
Thm 1): at every step each person joins the batch independently with probability q, with
all of their rows or none; a sampled person contributes the sum of the per-row gradients of
their rows (at most K, the dataset's contribution bound), clipped as one vector to norm C;
Gaussian noise N(0, σ²C²) is added to the sum over people, and the result is divided by a
public expected number of people per batch. Adding or removing one person adds or removes
one term of norm at most C, so the sampled Gaussian mechanism's RDP (Mironov, Talwar & Zhang
2019), with people in place of records, is the charge: SGM(q over people, σ, steps), the
plan the ledger charged (docs/privacy.md "Person-level DP-SGD").

Rows are grouped by person within their block once (:func:`people_of`: a person of a
`user` dataset lies in one block; a `user-time` block holds one period, whose person-period
is the unit protected, so a group is never split across the unit nor merges two); the sampler draws one 64-bit integer
per person (:class:`PersonBatches`, the record sampler's threshold); the per-person sums are
formed by ``index_add`` over per-row gradients (:func:`sum_grad_samples`, Opacus' hooks) or
by single-pass ghost clipping's per-person norms (:mod:`privsched.trainers.clipping`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from privsched.trainers.dpsgd import SAMPLER_BITS, inclusion_threshold, os_entropy_rng


def person_codes(users: np.ndarray) -> np.ndarray:
    """Each row's person as an index 0..P−1 (rows of one person share it), from the values of
    the user column; a missing column or a row without a person raises ``ValueError``."""
    values = np.asarray(users)
    if values.ndim != 1:
        raise ValueError("the user column must hold one value per row")
    if values.dtype.kind == "O" and any(v is None for v in values):
        raise ValueError("a row has no user id")
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError("a row has no user id")
    keys = values.astype(str) if values.dtype.kind == "O" else values
    return np.unique(keys, return_inverse=True)[1].reshape(-1).astype(np.int64)


def people_of(blocks: list[dict[str, np.ndarray]], user_column: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The records of ``blocks`` (each block's, read apart) concatenated, and each record's
    unit: its person within its block (a person of a `user` dataset, who lies in one block;
    a person in one period of a `user-time` one), so that adding or removing one unit adds or
    removes one group. Blocks without the user column, or with different columns, raise
    ``ValueError``."""
    if not blocks:
        raise ValueError("no blocks to read")
    names = set(blocks[0])
    if any(set(block) != names for block in blocks):
        raise ValueError("blocks hold different columns")
    if user_column not in names:
        raise ValueError(f"the blocks have no user column {user_column!r}")
    records = {name: np.concatenate([block[name] for block in blocks]) for name in names}
    persons = [person_codes(block[user_column]) for block in blocks]
    offsets = np.cumsum([0] + [int(codes.max()) + 1 if len(codes) else 0 for codes in persons[:-1]])
    return records, np.concatenate([codes + offset for codes, offset in zip(persons, offsets)]).astype(np.int64)


def person_split(people: np.ndarray, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) row indices, each person held out independently with probability
    ``holdout`` with all of their rows, from OS entropy: adding or removing one person
    changes no other person's side."""
    count = int(people.max()) + 1 if len(people) else 0
    held = np.random.default_rng(secrets.randbits(128)).random(count) < holdout
    return np.flatnonzero(~held[people]), np.flatnonzero(held[people])


class PersonBatches:
    """Poisson-sampled batches over people: at every step each person joins independently,
    with probability ⌊q·2⁶⁴⌋/2⁶⁴ ≤ q (one uniform 64-bit integer per person from an
    OS-seeded generator, as the record sampler draws per record), bringing all of their rows.
    Yields (inputs, labels, groups): ``groups`` maps each row of the batch to its person's
    index among the batch's people (0..p−1, in order of first row). An epoch is ``int(1/q)``
    steps; a batch may be empty."""

    def __init__(self, data: TensorDataset, people: np.ndarray, sample_rate: float, rng: np.random.Generator | None = None) -> None:
        if len(people) != len(data.tensors[0]):
            raise ValueError("every row needs its person")
        self.tensors = data.tensors
        self.people = np.unique(people, return_inverse=True)[1].reshape(-1).astype(np.int64)
        self.count = int(self.people.max()) + 1 if len(people) else 0
        self.sample_rate = sample_rate
        self.threshold = inclusion_threshold(sample_rate)
        self.rng = rng if rng is not None else os_entropy_rng()

    def __len__(self) -> int:
        return int(1 / self.sample_rate)

    def draw(self) -> np.ndarray:
        """Which people (of :attr:`count`) join one batch, as a boolean mask."""
        if self.threshold == 2**SAMPLER_BITS:
            return np.ones(self.count, dtype=bool)
        return self.rng.bit_generator.random_raw(self.count) < np.uint64(self.threshold)

    def batch(self, chosen: np.ndarray) -> tuple[torch.Tensor, ...]:
        """The rows of the ``chosen`` people and each row's person index in the batch."""
        rows = np.flatnonzero(chosen[self.people])
        _, groups = np.unique(self.people[rows], return_inverse=True)
        index = torch.from_numpy(rows)
        return (*(t.index_select(0, index) for t in self.tensors), torch.from_numpy(groups.reshape(-1).astype(np.int64)))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for _ in range(len(self)):
            yield self.batch(self.draw())


def sum_grad_samples(module: nn.Module, groups: torch.Tensor) -> None:
    """Replace each parameter's per-row gradients (Opacus' ``grad_sample``, n rows) with
    their sums per person (p rows, ``index_add`` by ``groups``), which the optimizer then
    clips as one sample each."""
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    for p in module.parameters():
        sample = getattr(p, "grad_sample", None)
        if sample is None:
            continue
        rows = torch.cat(sample, dim=0) if isinstance(sample, list) else sample
        index = groups.to(rows.device)
        # Opacus reads the attribute it set on the parameter; torch's stub does not declare it.
        p.grad_sample = rows.new_zeros((n_groups, *rows.shape[1:])).index_add_(0, index, rows)  # type: ignore[attr-defined]
