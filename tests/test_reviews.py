"""Synthetic reviews, the macrobenchmark pipeline mix, the non-private baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privsched.budgets import Accounting
from privsched.budgets.mechanisms import demand_vector
from privsched.trainers.builtin import plan_mechanism
from privsched.service.submissions import builtin_job
from privsched.spec import PipelineSpec
from privsched.jobs.records import read_block_files
from workloads.reviews import (
    ELEPHANT_EPSILONS,
    MICE_EPSILONS,
    ReviewSpec,
    non_private_baseline,
    pipeline_mix,
    write_blocks,
    write_pipelines,
)


def test_blocks_are_seeded_one_file_per_day(tmp_path):
    first = write_blocks(tmp_path / "a", days=3, per_day=50, seed=1)
    again = write_blocks(tmp_path / "b", days=3, per_day=50, seed=1)
    assert [p.name for p in first] == ["day-0000.npz", "day-0001.npz", "day-0002.npz"]
    a, b = read_block_files(first), read_block_files(again)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(read_block_files(first[:1])["tokens"], read_block_files(first[1:2])["tokens"])


def test_reviews_have_the_documented_layout(tmp_path):
    spec = ReviewSpec()
    records = read_block_files(write_blocks(tmp_path, days=1, per_day=2000, seed=2, spec=spec))
    tokens, length = records["tokens"], records["length"]
    assert tokens.shape == (2000, spec.seq_len) and int(records["vocab_size"]) == spec.vocab_size
    positions = np.arange(spec.seq_len)[None, :]
    assert np.all((tokens == 0) == (positions >= length[:, None]))
    assert np.all(records["sentiment"] == (records["rating"] >= 4))
    assert 0.4 < records["sentiment"].mean() < 0.6
    assert set(np.unique(records["category"])) == set(range(spec.n_categories))


def test_positive_words_mark_positive_reviews(tmp_path):
    spec = ReviewSpec()
    records = read_block_files(write_blocks(tmp_path, days=1, per_day=2000, seed=2, spec=spec))
    positive_words = ((records["tokens"] >= 1) & (records["tokens"] <= spec.sentiment_words)).sum(axis=1)
    sentiment = records["sentiment"]
    assert positive_words[sentiment == 1].mean() > 3 * positive_words[sentiment == 0].mean()


def test_bad_review_spec_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        ReviewSpec(vocab_size=100)


def test_pipeline_mix_is_three_quarters_mice(tmp_path):
    entries = pipeline_mix(days=10, per_day=100, seed=4, block_period=10.0)
    pipelines = [e["pipeline"] for e in entries]
    mice = [p for p in pipelines if p["job"]["kind"] == "statistic"]
    elephants = [p for p in pipelines if p["job"]["kind"] == "dpsgd"]
    assert 900 < len(pipelines) < 1100
    assert len(mice) / len(pipelines) == pytest.approx(0.75, abs=0.05)
    assert {p["epsilon"] for p in mice} == set(MICE_EPSILONS)
    assert {p["epsilon"] for p in elephants} == set(ELEPHANT_EPSILONS)
    assert all(1 <= p["blocks"]["last"] <= 500 for p in pipelines)
    assert all(p["delta"] == 1e-9 for p in elephants)
    assert all(p["timeout"] == 50.0 for p in pipelines)
    arrivals = [e["arrival"] for e in entries]
    assert arrivals == sorted(arrivals) and 0 <= arrivals[0] and arrivals[-1] < 100
    # elephants need more blocks at smaller ε, and more than mice
    by_model_eps = {(p["job"]["params"]["model"], p["epsilon"]): p["blocks"]["last"] for p in elephants}
    for (model, eps), blocks in by_model_eps.items():
        if (model, 5.0) in by_model_eps and eps < 5.0:
            assert blocks > by_model_eps[(model, 5.0)]
    assert np.mean([p["blocks"]["last"] for p in elephants]) > np.mean([p["blocks"]["last"] for p in mice])
    path = write_pipelines(tmp_path / "pipelines.jsonl", entries)
    assert [json.loads(line) for line in path.read_text().splitlines()] == entries


def test_every_pipeline_of_the_mix_is_a_valid_spec_whose_job_plans_a_positive_finite_demand():
    distinct = {}
    for entry in pipeline_mix(days=2, per_day=100, seed=4):
        spec = PipelineSpec.model_validate(entry["pipeline"])
        if spec.job.kind == "dpsgd" and spec.epsilon != 1.0:
            continue  # calibrating noise costs a moment: one ε per model is enough here
        job = {k: v for k, v in builtin_job(spec).items() if k != "seed"}
        distinct.setdefault((json.dumps(job, sort_keys=True), spec.epsilon), (builtin_job(spec), spec))
    assert {spec.job.kind for _, spec in distinct.values()} == {"statistic", "dpsgd"}
    for job, spec in distinct.values():
        demand = demand_vector(plan_mechanism(job, spec.epsilon, spec.delta, Accounting.rdp()), Accounting.rdp())
        assert np.all(np.isfinite(demand)) and np.all(demand > 0), (job, demand)


def test_non_private_baseline_learns_the_sentiment(tmp_path):
    paths = write_blocks(tmp_path, days=2, per_day=1000, seed=6)
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.05, "epochs": 3, "lr": 0.01, "optimizer": "adam"}
    result = non_private_baseline(paths, job)
    assert result["heldout_accuracy"] > 0.8


def test_non_private_baseline_needs_a_dpsgd_job(tmp_path):
    with pytest.raises(ValueError, match="dpsgd"):
        non_private_baseline([], {"kind": "statistic", "query": "count"})
