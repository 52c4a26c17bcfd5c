"""Features and splits of block records for the trainers (records are read through
:mod:`privsched.jobs.records`, which gates every block by the job's grant)."""

from __future__ import annotations

import secrets

import numpy as np


def bag_of_words(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Binary bag of words (n, vocab_size) as float32: 1 where a token occurs, padding id 0
    left out. Presence features keep per-example gradients near the clipping norm, so
    DP-SGD's noise drowns less signal than with frequencies."""
    n = len(tokens)
    features = np.zeros((n, vocab_size), dtype=np.float32)
    rows = np.repeat(np.arange(n), tokens.shape[1])
    ids = tokens.reshape(-1)
    keep = ids > 0
    features[rows[keep], ids[keep]] = 1.0
    return features


def split(n: int, holdout: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) index split from OS entropy: each record is held out independently
    with probability ``holdout``, so adding or removing one record changes no other
    record's side (the held-out metric and the training then compose, docs/design.md §7), and no
    user-visible seed can reveal which records were trained on."""
    held = np.random.default_rng(secrets.randbits(128)).random(n) < holdout
    return np.flatnonzero(~held), np.flatnonzero(held)
