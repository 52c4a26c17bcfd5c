"""Mechanism descriptions read without the models give the models' vectors to the bit, and
leave to the models everything they do not read as plainly valid."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import workloads

from privsched.budgets import mechanisms
from privsched.budgets.accounting import Accounting
from privsched.simulation.described import described_vector
from privsched.simulation.generated import mechanism_demand
from workloads import heterogeneous as hetero

ACCOUNTINGS = (Accounting.rdp(None), Accounting.basic(), Accounting.rdp((1.25, 2.0, 7.5, 100.0)))

in_range = st.one_of(st.floats(min_value=1e-3, max_value=0.999), st.sampled_from([1, 0.5, 3]))
numbers = st.one_of(
    in_range,
    in_range,
    in_range,
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-3, max_value=10**8),
    st.sampled_from(["0.5", "1e-8", "x", True, None, [], 1e-300, 0.0, 1.0]),
)
FIELDS = ("epsilon", "delta", "sigma", "scale", "sensitivity", "sample_rate", "noise_multiplier", "steps", "values", "other")
KINDS = ("epsilon_delta", "gaussian", "laplace", "subsampled_gaussian") * 3 + ("explicit", "Gaussian", "unknown")


@st.composite
def leaf(draw) -> dict:
    """A description of one of the kinds, with its own fields or others, in range or not."""
    kind = draw(st.sampled_from(KINDS))
    own = {
        "epsilon_delta": ("epsilon", "delta"),
        "gaussian": ("sigma", "sensitivity"),
        "laplace": ("scale", "sensitivity"),
        "subsampled_gaussian": ("sample_rate", "noise_multiplier", "steps"),
    }.get(kind, ())
    names = draw(st.lists(st.sampled_from(own), unique=True)) if own and not draw(st.integers(0, 5)) else list(own)
    names += draw(st.lists(st.sampled_from(FIELDS), max_size=1)) if not draw(st.integers(0, 5)) else []
    data: dict = {"kind": kind} if draw(st.integers(0, 9)) else {}
    for name in names:
        data[name] = draw(numbers) if name != "values" else draw(st.lists(numbers, max_size=12))
    return data


def composed(parts: st.SearchStrategy) -> st.SearchStrategy:
    return st.fixed_dictionaries({"kind": st.just("composed"), "parts": st.lists(parts, max_size=3)})


descriptions = st.recursive(leaf(), composed, max_leaves=5)


def models_vector(text: str, accounting: Accounting) -> np.ndarray | None:
    """The models' vector, or None where they refuse the description."""
    try:
        return mechanisms.demand_vector(mechanisms.parse_mechanism(text), accounting)
    except ValueError:
        return None


@settings(max_examples=200, deadline=None)
@given(descriptions, st.sampled_from(ACCOUNTINGS))
def test_a_description_read_without_models_is_one_the_models_accept_with_the_same_vector_to_the_bit(data, accounting):
    text = json.dumps(data, sort_keys=True)
    vector = described_vector(text, accounting)
    if vector is not None:
        expected = models_vector(text, accounting)
        assert expected is not None, f"read plainly, refused by the models: {text}"
        assert vector.tobytes() == np.asarray(expected, dtype=float).tobytes()


@settings(max_examples=100, deadline=None)
@given(
    st.floats(min_value=1e-6, max_value=1e6),
    st.floats(min_value=1e-6, max_value=1.0),
    st.floats(min_value=1e-6, max_value=1e3),
    st.integers(min_value=0, max_value=10**7),
)
def test_every_valid_description_of_the_plain_kinds_is_read_without_the_models(epsilon, rate, noise, steps):
    plain = [
        {"kind": "epsilon_delta", "epsilon": epsilon, "delta": 0.0},
        {"kind": "gaussian", "sigma": noise},
        {"kind": "laplace", "scale": noise, "sensitivity": 2},
        {"kind": "composed", "parts": [{"kind": "gaussian", "sigma": noise}, {"kind": "epsilon_delta", "epsilon": epsilon}]},
    ]
    plain.append({"kind": "subsampled_gaussian", "sample_rate": rate, "noise_multiplier": max(noise, 0.3), "steps": steps})
    for data in plain:
        text = json.dumps(data, sort_keys=True)
        expected = models_vector(text, ACCOUNTINGS[0])
        vector = described_vector(text, ACCOUNTINGS[0])
        assert vector is not None and expected is not None
        assert vector.tobytes() == expected.tobytes()


def test_what_the_models_refuse_still_raises_their_one_line_error_through_the_simulator():
    for data, message in [
        ({"kind": "gaussian", "sigma": 0}, "invalid mechanism: gaussian.sigma: must be in [1e-06, 1e+12], got 0"),
        ({"kind": "laplace", "scale": 1, "extra": 1}, "invalid mechanism: laplace.extra: Extra inputs are not permitted"),
    ]:
        try:
            mechanism_demand(json.dumps(data), ACCOUNTINGS[0])
        except ValueError as exc:
            assert str(exc) == message
        else:
            raise AssertionError(f"{data} accepted")
    basic = json.dumps({"kind": "gaussian", "sigma": 1.0})
    assert described_vector(basic, ACCOUNTINGS[1]) is None
    try:
        mechanism_demand(basic, ACCOUNTINGS[1])
    except ValueError as exc:
        assert "no pure (epsilon, delta) cost under basic accounting" in str(exc)
    else:
        raise AssertionError("a Gaussian has a basic cost")


def test_the_workloads_descriptions_are_all_read_without_the_models_with_the_models_vectors():
    zoo = hetero.zoo()
    seen = [(m, hetero.RDP) for m in zoo.mechanisms]
    for name in ("macro", "macro-rdp"):
        trace = workloads.generate(name, seed=1, days=2, pipelines_per_day=40)
        accounting = Accounting.rdp(None) if name.endswith("rdp") else Accounting.basic()
        seen += [(d["mechanism"], accounting) for d in trace.demands if "mechanism" in d]
    assert len(seen) > len(zoo.mechanisms)
    for mechanism, accounting in seen:
        text = json.dumps(mechanism, sort_keys=True)
        vector = described_vector(text, accounting)
        assert vector is not None, text
        assert vector.tobytes() == models_vector(text, accounting).tobytes()


def test_generating_the_heterogeneous_workload_imports_no_pydantic():
    code = "import sys, workloads; workloads.generate('heterogeneous', seed=3).instance; print('pydantic' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
