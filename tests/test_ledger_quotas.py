"""A team's quota counts what its pipelines hold over their whole life: the demand of its
granted and running pipelines and what its completed and failed ones consumed. Finishing
or failing a pipeline never frees its team's share of what it spent; only budget given
back (unspent by a completed job, released by a cancel, a failure before reading, or an
admin's release) does (docs/design.md §4.4, ``privsched/ledger/quotas.py``)."""

from __future__ import annotations

import pytest

from tests.support.teams import TeamLedger


@pytest.fixture
def teams(tmp_db):
    """Blocks b0 and b1 (ε_G = 1, unlocked); team blue may hold half of each, red a quarter."""
    shared = TeamLedger(tmp_db, ["b0", "b1"], {"blue": 0.5, "red": 0.25})
    yield shared
    shared.close()


def granted_and_finished(teams: TeamLedger, user: str, epsilon: float, spent_share: float = 1.0) -> int:
    """A pipeline of ``user`` on b0, granted, run and completed having spent ``spent_share`` of its grant."""
    pipeline_id = teams.submit(user, ["b0"], epsilon)
    assert teams.ledger.grant([pipeline_id]) == [pipeline_id]
    teams.ledger.mark_running(pipeline_id, {"slot": 0})
    teams.ledger.complete(pipeline_id, {"b0": [epsilon * spent_share, 0.0]})
    return pipeline_id


def test_a_completed_pipeline_keeps_counting_what_it_spent_against_its_team(teams):
    granted_and_finished(teams, "ann", 0.375)
    over = teams.submit("bea", ["b0"], 0.25)
    assert teams.ledger.grant([over]) == []  # 0.375 spent + 0.25 > 0.5
    exact = teams.submit("bea", ["b0"], 0.125)
    assert teams.ledger.grant([exact]) == [exact]  # 0.375 + 0.125 = 0.5 fits
    assert teams.held("blue") == {"b0": 0.5}


def test_a_team_that_spent_its_quota_stays_at_it_after_every_pipeline_ends(teams):
    granted_and_finished(teams, "ann", 0.25)
    granted_and_finished(teams, "bea", 0.25)
    later = teams.submit("ann", ["b0"], 0.0625)
    assert teams.ledger.grant([later]) == []
    assert teams.held("blue") == {"b0": 0.5}


def test_a_completed_pipeline_frees_only_what_it_did_not_spend(teams):
    granted_and_finished(teams, "ann", 0.5, spent_share=0.5)  # spent 0.25, gave 0.25 back
    fits = teams.submit("bea", ["b0"], 0.25)
    over = teams.submit("bea", ["b0"], 0.0625)
    assert teams.ledger.grant([fits, over]) == [fits]
    assert teams.held("blue") == {"b0": 0.5}


def test_a_failure_after_reading_counts_its_whole_grant_against_its_team(teams):
    crashed = teams.submit("ann", ["b0", "b1"], 0.375)
    assert teams.ledger.grant([crashed]) == [crashed]
    teams.ledger.mark_running(crashed, {"slot": 0})
    teams.ledger.fail(crashed, "crashed", touched_data=True)
    retry = teams.submit("ann", ["b1"], 0.25)
    assert teams.ledger.grant([retry]) == []
    assert teams.held("blue") == {"b0": 0.375, "b1": 0.375}


def test_a_failure_before_reading_frees_its_team_share(teams):
    crashed = teams.submit("ann", ["b0"], 0.5)
    assert teams.ledger.grant([crashed]) == [crashed]
    teams.ledger.fail(crashed, "could not start", touched_data=False)
    retry = teams.submit("ann", ["b0"], 0.5)
    assert teams.ledger.grant([retry]) == [retry]


def test_a_released_failure_frees_its_team_share(teams):
    crashed = teams.submit("ann", ["b0"], 0.5)
    teams.ledger.grant([crashed])
    teams.ledger.fail(crashed, "crashed", touched_data=True)
    blocked = teams.submit("bea", ["b0"], 0.25)
    assert teams.ledger.grant([blocked]) == []
    teams.ledger.release(crashed, "the job never opened its data")
    assert teams.ledger.grant([blocked]) == [blocked]
    assert teams.held("blue") == {"b0": 0.25}


def test_a_cancelled_grant_frees_its_team_share(teams):
    cancelled = teams.submit("ann", ["b0"], 0.5)
    teams.ledger.grant([cancelled])
    teams.ledger.cancel(cancelled)
    again = teams.submit("bea", ["b0"], 0.5)
    assert teams.ledger.grant([again]) == [again]


def test_a_teams_spending_holds_back_neither_other_teams_nor_the_operator(teams):
    granted_and_finished(teams, "ann", 0.5)
    red = teams.submit("rex", ["b0"], 0.25)
    operator = teams.submit(None, ["b0"], 0.25)
    blue = teams.submit("bea", ["b0"], 0.0625)
    assert teams.ledger.grant([red, operator, blue]) == [red, operator]
    assert (teams.held("blue"), teams.held("red")) == ({"b0": 0.5}, {"b0": 0.25})
