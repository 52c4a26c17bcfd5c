"""Policy names, parameters and unlock rules (docs/design.md §4.1)."""

from __future__ import annotations

import pytest

from privsched.policies import (
    POLICY_NAMES,
    DominantPrivateBlockFairness,
    DPack,
    FirstComeFirstServed,
    Optimal,
    RoundRobin,
    UnlockAll,
    UnlockPerArrival,
    UnlockPerTime,
    make_policy,
)


@pytest.mark.parametrize(
    ("name", "kwargs", "policy", "unlock"),
    [
        ("fcfs", {}, FirstComeFirstServed, UnlockAll()),
        ("rr-n", {"n": 5}, RoundRobin, UnlockPerArrival(5)),
        ("rr-t", {"lifetime": 30.0}, RoundRobin, UnlockPerTime(30.0)),
        ("dpf-n", {"n": 5}, DominantPrivateBlockFairness, UnlockPerArrival(5)),
        ("dpf-t", {"lifetime": 30.0}, DominantPrivateBlockFairness, UnlockPerTime(30.0)),
        ("dpack", {}, DPack, UnlockAll()),
        ("dpack", {"n": 5}, DPack, UnlockPerArrival(5)),
        ("dpack", {"lifetime": 30.0}, DPack, UnlockPerTime(30.0)),
        ("optimal", {}, Optimal, UnlockAll()),
    ],
)
def test_each_name_pairs_its_ordering_with_its_default_unlock_rule(name, kwargs, policy, unlock) -> None:
    spec = make_policy(name, **kwargs)
    assert spec.name == name and spec.policy.name == name
    assert isinstance(spec.policy, policy)
    assert spec.unlock == unlock


def test_every_listed_name_builds() -> None:
    assert {make_policy(name, n=10, lifetime=5.0).name for name in POLICY_NAMES} == set(POLICY_NAMES)


def test_unlock_overrides_the_default_pairing() -> None:
    spec = make_policy("fcfs", unlock="n", n=4)
    assert isinstance(spec.policy, FirstComeFirstServed) and spec.unlock == UnlockPerArrival(4)
    assert make_policy("dpf-n", unlock="all").unlock == UnlockAll()


def test_parameters_are_recorded() -> None:
    assert make_policy("dpack", lifetime=10.0, k=7).params == {"unlock": "t", "lifetime": 10.0, "k": 7}


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("lottery", {}, "unknown policy 'lottery'"),
        ("dpf-n", {}, "needs n"),
        ("rr-t", {}, "needs lifetime"),
        ("dpf-n", {"n": 0}, "n must be a positive integer"),
        ("dpf-n", {"n": 2.5}, "n must be a positive integer"),
        ("dpf-t", {"lifetime": -1.0}, "lifetime must be a positive"),
        ("dpf-t", {"lifetime": float("inf")}, "lifetime must be a positive"),
        ("dpack", {"k": 0}, "k must be a positive integer"),
        ("optimal", {"time_limit": 0.0}, "time_limit must be a positive"),
        ("fcfs", {"unlock": "sometimes"}, "unknown unlock rule 'sometimes'"),
    ],
)
def test_bad_names_and_parameters_raise_one_clear_line(name, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message) as error:
        make_policy(name, **kwargs)
    assert "\n" not in str(error.value)


def test_unlock_fractions() -> None:
    assert (UnlockAll().on_block_created(), UnlockAll().on_pipeline_arrival(), UnlockAll().on_tick(5.0)) == (1.0, 0.0, 0.0)
    per_arrival = UnlockPerArrival(4)
    assert (per_arrival.on_block_created(), per_arrival.on_pipeline_arrival(), per_arrival.on_tick(5.0)) == (0.0, 0.25, 0.0)
    per_time = UnlockPerTime(20.0)
    assert (per_time.on_block_created(), per_time.on_pipeline_arrival(), per_time.on_tick(5.0)) == (0.0, 0.0, 0.25)


def test_per_time_unlocking_rejects_negative_elapsed_time() -> None:
    with pytest.raises(ValueError, match="elapsed"):
        UnlockPerTime(20.0).on_tick(-1.0)


@pytest.mark.parametrize(
    ("name", "kwargs", "unlock"),
    [
        ("dpack-n", {"n": 4, "k": 3}, UnlockPerArrival(4)),
        ("dpack-t", {"lifetime": 30.0, "k": 3}, UnlockPerTime(30.0)),
    ],
)
def test_dpack_aliases_fix_the_unlock_rule_and_keep_their_name(name, kwargs, unlock) -> None:
    spec = make_policy(name, **kwargs)
    assert (spec.name, spec.unlock) == (name, unlock)
    assert isinstance(spec.policy, DPack) and spec.policy.k == 3
    assert spec.params["k"] == 3


@pytest.mark.parametrize(
    ("name", "kwargs", "fair_share"),
    [("dpf-n", {"n": 8}, 1 / 8), ("dpack-n", {"n": 4}, 1 / 4), ("dpf-t", {"lifetime": 9.0}, None), ("fcfs", {}, None)],
)
def test_elastic_top_ups_are_capped_at_the_per_arrival_fair_share(name, kwargs, fair_share) -> None:
    assert make_policy(name, **kwargs).policy.fair_share == fair_share  # type: ignore[attr-defined]


def test_an_alias_refuses_another_unlock_rule() -> None:
    with pytest.raises(ValueError, match="always unlocks with rule 'n'"):
        make_policy("dpack-n", n=4, unlock="t", lifetime=5.0)


def test_serve_and_simulate_accept_every_registry_name_with_the_same_options(tmp_path) -> None:
    from privsched.ledger import Ledger
    from privsched.service.serve import serve_options
    from privsched.simulation import parse_trace, simulate

    Ledger.init(tmp_path / "db").close()
    trace = {
        "accounting": "basic",
        "blocks": [{"id": "b0", "epsilon": 1.0}],
        "pipelines": [{"id": "p0", "arrival": 0.0, "blocks": ["b0"], "epsilon": 0.5}],
    }
    for name in POLICY_NAMES:
        options = {"n": 2, "lifetime": 10.0, "k": 2, "unlock": None}
        served = serve_options(tmp_path / "db", name, **options, until_idle=True, cpus=1, memory="1G")
        assert served.ticks == 1
        assert simulate(parse_trace(trace), name, **options).policy == name
