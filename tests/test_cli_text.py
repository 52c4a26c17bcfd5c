"""User text is printed as text: markup is never interpreted, control characters never
reach the terminal, and names that could carry them are refused at input."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cli_inprocess import invoke
from privsched.ledger import Ledger, PipelineRequest
from privsched.text import BIDI_CONTROLS, escape_char, fill_template, is_unsafe, name_problem, printable

MARKUP = "[/]"
ESCAPE = "\x1b[2J\x1b]0;owned\x07"


def unsafe_in(output: str) -> list[str]:
    """The characters of ``output`` that could drive a terminal (newlines are the output's own)."""
    return [c for c in output if c != "\n" and is_unsafe(c)]


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "p.db"
    assert invoke("init", db=path).code == 0
    return path


def test_a_dataset_named_like_markup_is_created_and_listed(db):
    created = invoke("dataset", "create", MARKUP, "--epsilon", "1", "--delta", "1e-6", db=db)
    assert created.code == 0 and MARKUP in created.stdout
    assert invoke("blocks", "add", MARKUP, MARKUP, "[bold]k", db=db).code == 0
    for command in (["dataset", "list"], ["blocks", "list"], ["budget", "show"], ["budget", "show", MARKUP]):
        shown = invoke(*command, db=db)
        assert shown.code == 0, shown.stderr
        assert MARKUP in shown.stdout, command
    assert "[bold]k" in invoke("blocks", "list", db=db).stdout


def test_markup_and_escape_sequences_in_stored_text_are_shown_escaped(db):
    invoke("dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6", "--accounting", "basic", db=db)
    invoke("blocks", "add", "d", "b", "--unlocked", "1", db=db)
    with Ledger(db) as ledger:  # a job's error message is stored as the job wrote it
        pid = ledger.submit(PipelineRequest("[red]p[/]", "d", ["b"], demand=np.array([0.1, 0.0]), owner="[/]x"))
        ledger.grant([pid])
        ledger.mark_running(pid, {})
        ledger.fail(pid, f"{MARKUP}{ESCAPE}")
    for command in (["status", str(pid)], ["list"]):
        shown = invoke(*command, db=db)
        assert shown.code == 0, shown.stderr
        assert not unsafe_in(shown.stdout), command
    status = invoke("status", str(pid), db=db).stdout
    assert "\\x1b[2J" in status and MARKUP in status and "[/]x" in status


@pytest.mark.parametrize("bad", ["\x1b[31mred", "a\rb", "tab\there", "\u202eevil", "nul\x00", "\x9bc1"])
def test_control_characters_in_names_and_owners_are_refused(db, tmp_path, bad, dump_db):
    before = dump_db(db)
    made = invoke("dataset", "create", bad, "--epsilon", "1", "--delta", "1e-6", db=db)
    assert made.code == 1 and made.stderr.count("\n") == 1 and "control character" in made.stderr
    assert not unsafe_in(made.stderr)
    invoke("dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6", "--accounting", "basic", db=db)
    invoke("blocks", "add", "d", "b", "--unlocked", "1", db=db)
    after_setup = dump_db(db)
    assert after_setup != before
    assert invoke("blocks", "add", "d", bad, db=db).code == 1
    spec = tmp_path / "p.json"
    spec.write_text('{"name": "p", "dataset": "d", "blocks": ["b"], "epsilon": 0.1, "job": {"function": "tests.service_jobs:spend_half"}}')
    refused = invoke("submit", spec, "--owner", bad, db=db)
    assert refused.code == 1 and "owner" in refused.stderr and not unsafe_in(refused.stderr)
    assert dump_db(db) == after_setup


@given(st.text())
def test_printable_text_never_holds_a_control_character(value):
    shown = printable(value)
    assert not any(is_unsafe(c) for c in shown)
    if not any(is_unsafe(c) for c in value):
        assert shown == value


def test_an_ascii_character_is_unsafe_exactly_when_python_calls_it_unprintable():
    # printable's fast path for ASCII text rests on this
    for code in range(128):
        assert is_unsafe(chr(code)) == (not chr(code).isprintable()), hex(code)


@given(st.text(alphabet=st.characters(max_codepoint=0x7F)) | st.text())
def test_printable_escapes_each_unsafe_character_and_keeps_the_rest(value):
    assert printable(value) == "".join(escape_char(c) if is_unsafe(c) else c for c in value)


@given(st.text(min_size=1, max_size=300))
def test_a_name_is_accepted_exactly_when_it_is_short_non_blank_and_safe(value):
    safe = all(unicodedata.category(c) not in ("Cc", "Cs", "Zl", "Zp") and c not in BIDI_CONTROLS for c in value)
    assert (name_problem(value) is None) == (safe and bool(value.strip()) and len(value) <= 256)


@pytest.mark.parametrize(
    "template", ["{key.__class__.__init__.__globals__}", "{key.foo}", "{key[abc]}", "{0}", "{key!r}", "{key:>9}", "{", "}", "{other}"]
)
def test_location_templates_substitute_only_the_documented_fields(db, template, dump_db):
    invoke("dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6", db=db)
    before = dump_db(db)
    added = invoke("blocks", "add", "d", "k1", "--location-template", template, db=db)
    assert added.code == 1 and added.stderr.count("\n") == 1 and "{key}, {dataset}" in added.stderr
    assert "globals" not in added.stderr or "__globals__" in template
    assert dump_db(db) == before


def test_location_template_fills_key_dataset_and_braces(db, monkeypatch):
    invoke("dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6", db=db)
    monkeypatch.chdir(db.parent)
    (db.parent / "d/{x}").mkdir(parents=True)
    (db.parent / "d/{x}/k1.npz").touch()
    assert invoke("blocks", "add", "d", "k1", "--location-template", "{dataset}/{{x}}/{key}.npz", db=db).code == 0
    with Ledger(db) as ledger:
        assert ledger.get_block("d", "k1").location == str(db.parent / "d/{x}/k1.npz")
    assert fill_template("{key}{key}", key="a") == "aa"


def test_ids_beyond_64_bits_are_one_line_errors(db):
    for command in ("status", "cancel", "logs"):
        shown = invoke(command, "9" * 40, db=db)
        assert shown.code == 1 and shown.stderr.count("\n") == 1 and "64-bit" in shown.stderr
