"""Elastic demands in the policies (docs/design.md §4.2, elastic demands)."""

from __future__ import annotations

import numpy as np
import pytest

from privsched.policies.admission import validate, validate_allocation
from privsched.policies.base import Allocation, Snapshot
from tests.support.snapshots import make_snapshot


def _elastic(snapshot: Snapshot, low: list[float]) -> Snapshot:
    return Snapshot(**{**snapshot.__dict__, "elastic_min": np.array(low, dtype=float)})


@pytest.mark.parametrize("low", [[0.5], [0.0, 1.0], [1.5, 1.0], [np.nan, 1.0]])
def test_a_snapshot_with_a_malformed_elastic_minimum_is_rejected_with_one_line(low) -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[2.0]), low)
    with pytest.raises(ValueError, match="elastic_min") as error:
        validate(snapshot)
    assert "\n" not in str(error.value)


def test_an_allocation_outside_a_pipelines_range_is_rejected() -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[2.0]), [0.5, 1.0])
    validate_allocation(snapshot, Allocation(granted=np.array([0, 1]), fraction=np.array([0.5, 1.0])))
    for fraction in ([0.4, 1.0], [0.5, 0.9], [1.1, 1.0], [1.0]):
        with pytest.raises(ValueError) as error:
            validate_allocation(snapshot, Allocation(granted=np.array([0, 1]), fraction=np.array(fraction)))
        assert "\n" not in str(error.value)


def test_an_allocation_without_fractions_grants_every_pipeline_its_whole_demand() -> None:
    assert Allocation(granted=np.array([2, 0])).fractions().tolist() == [1.0, 1.0]
