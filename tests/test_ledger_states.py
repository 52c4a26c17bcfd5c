"""Pipeline states carry their behaviour: which are final, which hold an allocation."""

from __future__ import annotations

import json

from privsched.ledger import PipelineState


def test_final_states_are_the_four_ends_of_the_life_cycle() -> None:
    assert {s.value for s in PipelineState if s.is_final()} == {"completed", "failed", "timed_out", "cancelled"}


def test_granted_and_running_pipelines_hold_an_allocation() -> None:
    assert {s.value for s in PipelineState if s.holds_allocation()} == {"granted", "running"}


def test_a_state_reads_as_its_name_in_text_json_and_comparisons() -> None:
    state = PipelineState.TIMED_OUT
    assert (str(state), f"{state}", f"{state:>10}", json.dumps(state)) == ("timed_out", "timed_out", " timed_out", '"timed_out"')
    assert state == "timed_out" and PipelineState("timed_out") is state
