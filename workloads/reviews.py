"""Synthetic product reviews and the macrobenchmark pipeline mix (OSDI'21 §6.2, docs/design.md §5.2).

Reviews stand in for Amazon Reviews: each has a product category, a rating (1–5) and a
sentiment (rating ≥ 4, half of the reviews), and its text is a sequence of token ids drawn from a vocabulary
laid out as::

    0 (padding) | positive words | negative words | category words (per category) | neutral words

Every position is a sentiment word with probability ``p_sentiment`` (of the review's
polarity, flipped with probability ``p_confusion``), a word of the review's category with
probability ``p_category``, and otherwise a neutral word drawn from a Zipf law. So the
sentiment and the category are learnable but not trivially so. One ``.npz`` block file is
written per day (see :mod:`privsched.jobs.records` for its arrays); everything is seeded.

:func:`pipeline_mix` draws the macrobenchmark's pipelines: 75 % mice (DP statistics with
the Laplace mechanism, ε ∈ {0.01, 0.05, 0.1}) on few recent blocks, 25 % elephants (DP-SGD
models of the zoo, ε ∈ {0.5, 1, 5}, δ = 1e-9) on many, more at smaller ε; 1 to 500 blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ReviewSpec:
    """Shape and signal of the synthetic reviews."""

    vocab_size: int = 1000
    seq_len: int = 24
    min_len: int = 8
    n_categories: int = 5
    sentiment_words: int = 30  # per polarity
    category_words: int = 20  # per category
    p_sentiment: float = 0.15
    p_confusion: float = 0.1
    p_category: float = 0.15

    def __post_init__(self) -> None:
        first_neutral = 1 + 2 * self.sentiment_words + self.n_categories * self.category_words
        if self.vocab_size <= first_neutral:
            raise ValueError(f"vocab_size must exceed {first_neutral} for this layout")
        if not 1 <= self.min_len <= self.seq_len:
            raise ValueError("need 1 <= min_len <= seq_len")
        if not 0 <= self.p_sentiment + self.p_category <= 1 or not 0 <= self.p_confusion <= 0.5:
            raise ValueError("word probabilities must lie in [0, 1] (confusion at most 0.5)")


def generate_reviews(n: int, rng: np.random.Generator, spec: ReviewSpec = ReviewSpec()) -> dict[str, np.ndarray]:
    """``n`` synthetic reviews as the arrays of one block file."""
    s = spec
    category = rng.integers(0, s.n_categories, n)
    rating = rng.choice([1, 2, 3, 4, 5], size=n, p=[0.15, 0.15, 0.2, 0.25, 0.25])
    sentiment = (rating >= 4).astype(np.int64)
    length = rng.integers(s.min_len, s.seq_len + 1, n)

    kind = rng.random((n, s.seq_len))
    is_sentiment = kind < s.p_sentiment
    is_category = (kind >= s.p_sentiment) & (kind < s.p_sentiment + s.p_category)
    polarity = np.where(rng.random((n, s.seq_len)) < s.p_confusion, 1 - sentiment[:, None], sentiment[:, None])
    # positive words are 1..W, negative W+1..2W
    sentiment_ids = 1 + (1 - polarity) * s.sentiment_words + rng.integers(0, s.sentiment_words, (n, s.seq_len))
    first_category = 1 + 2 * s.sentiment_words
    category_ids = first_category + category[:, None] * s.category_words + rng.integers(0, s.category_words, (n, s.seq_len))
    first_neutral = first_category + s.n_categories * s.category_words
    neutral_ranks = np.arange(1, s.vocab_size - first_neutral + 1)
    zipf = 1.0 / neutral_ranks
    neutral_ids = first_neutral + rng.choice(len(neutral_ranks), size=(n, s.seq_len), p=zipf / zipf.sum())

    tokens = np.where(is_sentiment, sentiment_ids, np.where(is_category, category_ids, neutral_ids))
    tokens[np.arange(s.seq_len)[None, :] >= length[:, None]] = 0
    return {
        "tokens": tokens.astype(np.int32),
        "sentiment": sentiment,
        "category": category.astype(np.int64),
        "rating": rating.astype(np.float64),
        "length": length.astype(np.int64),
        "vocab_size": np.asarray(s.vocab_size),
        "n_categories": np.asarray(s.n_categories),
    }


def write_blocks(directory: str | Path, days: int, per_day: int, seed: int = 0, spec: ReviewSpec = ReviewSpec()) -> list[Path]:
    """One block file ``day-XXXX.npz`` per day, each from its own seeded stream."""
    if days < 1 or per_day < 1:
        raise ValueError("need at least one day and one review per day")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for day, stream in enumerate(np.random.SeedSequence(seed).spawn(days)):
        path = directory / f"day-{day:04d}.npz"
        np.savez(path, allow_pickle=False, **generate_reviews(per_day, np.random.default_rng(stream), spec))
        paths.append(path)
    return paths


#: The macrobenchmark's mix (docs/design.md §5.2).
MICE_EPSILONS = (0.01, 0.05, 0.1)
ELEPHANT_EPSILONS = (0.5, 1.0, 5.0)
ELEPHANT_DELTA = 1e-9
#: Blocks an elephant asks for at ε = 1 (the least data reaching its target accuracy);
#: the demand scales as 1/ε, capped at 500.
ELEPHANT_BLOCKS = {"logreg": 20, "mlp": 40, "cnn": 60, "text": 60, "lstm": 100}
ELEPHANT_TRAINING = {
    "logreg": {"sample_rate": 0.05, "epochs": 5, "lr": 0.01, "optimizer": "adam"},
    "mlp": {"sample_rate": 0.1, "epochs": 5, "lr": 0.02, "optimizer": "adam"},
    "cnn": {"sample_rate": 0.05, "epochs": 5, "lr": 0.02, "optimizer": "adam"},
    "text": {"sample_rate": 0.05, "epochs": 10, "lr": 0.1, "optimizer": "adam"},
    "lstm": {"sample_rate": 0.05, "epochs": 5, "lr": 0.02, "optimizer": "adam"},
}
MICE_QUERIES = (
    {"query": "count"},
    {"query": "mean", "column": "rating", "bounds": [1.0, 5.0]},
    {"query": "histogram", "column": "rating", "bounds": [0.5, 5.5], "bins": 5},
    {"query": "sum", "column": "sentiment", "bounds": [0.0, 1.0]},
)


def pipeline_mix(
    days: int,
    per_day: int,
    seed: int = 0,
    dataset: str = "reviews",
    block_period: float = 86400.0,
    timeout_periods: float = 5.0,
) -> list[dict]:
    """Pipelines arriving as a Poisson process of ``per_day`` per block period for ``days``.

    Each entry is ``{"arrival": seconds, "pipeline": spec}`` where ``spec`` is a
    :class:`privsched.spec.PipelineSpec` mapping whose job is a built-in job of
    :mod:`privsched.trainers.builtin`; a pipeline times out after ``timeout_periods`` block
    periods. Mice (75 %) ask for 1–10 recent blocks, elephants for
    ``ELEPHANT_BLOCKS[model] / ε`` (1 to 500)."""
    if days < 1 or per_day <= 0 or block_period <= 0:
        raise ValueError("need at least one day, a positive arrival rate and block period")
    rng = np.random.default_rng(seed)
    count = rng.poisson(per_day * days)
    arrivals = np.sort(rng.uniform(0, days * block_period, count))
    models = list(ELEPHANT_BLOCKS)
    pipelines = []
    for i, arrival in enumerate(arrivals):
        if rng.random() < 0.75:
            epsilon = float(rng.choice(MICE_EPSILONS))
            kind, params = "statistic", {"noise": "laplace", **MICE_QUERIES[rng.integers(len(MICE_QUERIES))]}
            blocks, delta, label = int(rng.integers(1, 11)), 0.0, "mouse"
        else:
            epsilon = float(rng.choice(ELEPHANT_EPSILONS))
            model = models[rng.integers(len(models))]
            kind, params = "dpsgd", {"model": model, **ELEPHANT_TRAINING[model], "seed": i}
            blocks = int(np.clip(round(ELEPHANT_BLOCKS[model] / epsilon), 1, 500))
            delta, label = ELEPHANT_DELTA, "elephant"
        spec = {
            "name": f"{label}-{i:05d}",
            "dataset": dataset,
            "blocks": {"last": blocks},
            "epsilon": epsilon,
            "delta": delta,
            "job": {"kind": kind, "params": params},
            "timeout": timeout_periods * block_period,
        }
        pipelines.append({"arrival": float(arrival), "pipeline": spec})
    return pipelines


def write_pipelines(path: str | Path, pipelines: list[dict]) -> Path:
    """Save :func:`pipeline_mix` entries as JSON lines, one pipeline per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in pipelines))
    return path


def non_private_baseline(block_paths: list[str | Path], job: dict, device: str = "cpu") -> dict[str, float]:
    """Train the model of a ``dpsgd`` job on the same blocks and held-out split without
    privacy (same optimiser, epochs and expected batch size); returns held-out loss and
    accuracy, the reference a private model is compared with."""
    import torch

    from privsched.jobs.records import read_block_files
    from privsched.trainers.dpsgd import evaluate, expected_batch_size, fit, initial_model, plain_trainer, train_heldout
    from privsched.trainers.plans import DPSGDJob, parse_job

    spec = parse_job(job)
    if not isinstance(spec, DPSGDJob):
        raise ValueError("a non-private baseline needs a dpsgd job")
    data, train, heldout = train_heldout(read_block_files(block_paths), spec)
    model = initial_model(spec, data)
    fit(plain_trainer(model, train, spec, torch.device(device), expected_batch_size(spec, data.rows)), spec.steps)
    loss, accuracy = evaluate(model, heldout, torch.device(device))
    return {"heldout_loss": loss, "heldout_accuracy": accuracy}
