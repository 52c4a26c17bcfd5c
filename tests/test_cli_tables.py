"""The command line's plain-text tables: aligned in terminal cells, user text escaped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from privsched.cli.tables import Table, cell_width
from privsched.text import is_unsafe

cells = st.text(max_size=12)


@given(st.lists(st.tuples(cells, cells, cells), max_size=6), st.booleans())
def test_every_line_of_a_table_is_equally_wide_and_safe_to_print(rows, header):
    table = Table("id", "名前", "state", show_header=header)
    for row in rows:
        table.add_row(*row)
    lines = table.render().splitlines()
    assert len({cell_width(line) for line in lines}) == 1
    assert not [c for line in lines for c in line if is_unsafe(c)]
    assert len(lines) == len(rows) + (4 if header else 2)


def test_markup_and_escape_sequences_are_shown_as_text():
    table = Table("name", title="[bold]t", caption="\x1b[2J")
    table.add_row("[/]")
    shown = table.render()
    assert "[/]" in shown and "[bold]t" in shown and "\\x1b[2J" in shown and "\x1b" not in shown


def test_wide_characters_take_two_cells_and_combining_marks_none():
    assert cell_width("ab") == 2
    assert cell_width("日本") == 4
    assert cell_width("e\u0301") == 1


def test_a_table_draws_its_header_rows_and_caption_like_the_listings_did():
    table = Table("id", "name", title="T title", caption="a caption")
    table.add_row("1", "abc")
    table.add_row("22", "d")
    assert table.render().splitlines() == [
        "   T title   ",
        "┏━━━━┳━━━━━━┓",
        "┃ id ┃ name ┃",
        "┡━━━━╇━━━━━━┩",
        "│ 1  │ abc  │",
        "│ 22 │ d    │",
        "└────┴──────┘",
        "  a caption  ",
    ]


def test_a_row_may_not_have_more_cells_than_the_table_has_columns():
    with pytest.raises(ValueError, match="2 cells"):
        Table("a").add_row("1", "2")
