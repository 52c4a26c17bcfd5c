"""The mechanism models are built when first used, and a description's JSON is the same text
whichever serializer writes it (the ledger stores it, :func:`parse_mechanism` reads it back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from privsched.budgets.bounds import (
    MAX_DEMAND,
    MAX_EPSILON,
    MAX_NOISE,
    MAX_SENSITIVITY,
    MAX_STEPS,
    MIN_DELTA,
    MIN_EPSILON,
    MIN_NOISE,
    MIN_SAMPLE_RATE,
    MIN_SENSITIVITY,
)
from privsched.budgets.mechanisms import (
    Composed,
    EpsilonDelta,
    Explicit,
    Gaussian,
    Laplace,
    Mechanism,
    SubsampledGaussian,
    mechanism_json,
    parse_mechanism,
)

from .conftest import REPO


def between(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


noise = between(MIN_NOISE, MAX_NOISE)
sensitivity = between(MIN_SENSITIVITY, MAX_SENSITIVITY)
delta = st.one_of(st.just(0.0), between(MIN_DELTA, 0.999999))

leaves = st.one_of(
    st.builds(EpsilonDelta, epsilon=between(MIN_EPSILON, MAX_EPSILON), delta=delta),
    st.builds(Gaussian, sigma=noise, sensitivity=sensitivity),
    st.builds(Laplace, scale=noise, sensitivity=sensitivity),
    st.builds(SubsampledGaussian, sample_rate=between(MIN_SAMPLE_RATE, 1.0), noise_multiplier=noise, steps=st.integers(0, MAX_STEPS)),
    st.builds(Explicit, values=st.lists(between(0.0, MAX_DEMAND), min_size=1, max_size=8)),
)
mechanisms = st.recursive(leaves, lambda parts: st.builds(Composed, parts=st.lists(parts, min_size=1, max_size=3)), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(mechanisms)
def test_a_mechanisms_json_is_the_unions_and_reads_back_equal(mechanism):
    assert mechanism_json(mechanism) == TypeAdapter(Mechanism).dump_json(mechanism).decode()
    assert parse_mechanism(mechanism_json(mechanism)) == mechanism


#: Imports the mechanisms, charges a DP-SGD plan as a submission does, and prints which of
#: the six models have built their validators.
PROBE = """
import json
from privsched.budgets import mechanisms as m
kinds = ("EpsilonDelta", "Gaussian", "Laplace", "SubsampledGaussian", "Composed", "Explicit")
built = lambda: [k for k in kinds if getattr(m, k).__pydantic_complete__]
at_import = built()
m.mechanism_json(m.SubsampledGaussian(sample_rate=0.05, noise_multiplier=1.1, steps=40))
print(json.dumps([at_import, built()]))
"""


def test_importing_the_mechanisms_builds_no_model_and_a_plan_builds_only_its_own():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [[], ["SubsampledGaussian"]]
