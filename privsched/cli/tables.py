"""Plain-text tables for the command line's listings, drawn as Rich draws its default table
(heavy header rule, light body), without importing Rich.

Every cell, title and caption is user text shown as text: it goes through
:func:`privsched.text.printable` (control characters escaped) and nothing in it is
interpreted. Columns are as wide as their widest cell, counted in terminal cells (East
Asian wide characters take two, combining marks none); rows are never wrapped, so a
listing piped to ``grep`` keeps one record per line. Rich, whose import and table layout
weigh on a command that answers in a few tenths of a second (issue 16), stays for progress
bars and the simulator's reports.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from privsched.text import printable


def cell_width(text: str) -> int:
    """Terminal cells ``text`` takes: 2 for a wide or full-width character, 0 for a
    combining mark, 1 otherwise."""
    return sum(0 if unicodedata.combining(char) else 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1 for char in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - cell_width(text))


def _centred(text: str, width: int) -> str:
    room = max(width - cell_width(text), 0)
    return " " * (room // 2) + text + " " * (room - room // 2)


class Table:
    """Columns with a header (unless ``show_header`` is false), rows of cells, and an
    optional title above and caption below, each centred on the table."""

    def __init__(self, *columns: str, title: object = None, caption: object = None, show_header: bool = True) -> None:
        self.columns = [printable(column) for column in columns]
        self.title = None if title is None else printable(title)
        self.caption = None if caption is None else printable(caption)
        self.show_header = show_header
        self.rows: list[list[str]] = []

    def add_row(self, *cells: object) -> None:
        """A row of cells, each shown as the text of its value (missing cells are empty)."""
        if len(cells) > len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)} columns")
        self.rows.append([printable(cell) for cell in cells] + [""] * (len(self.columns) - len(cells)))

    def lines(self) -> Iterator[str]:
        """The table's lines, without line ends."""
        shown = [self.columns, *self.rows] if self.show_header else self.rows
        widths = [max((cell_width(row[i]) for row in shown), default=0) for i in range(len(self.columns))]
        rules = ["─" * (width + 2) for width in widths]
        heavy = ["━" * (width + 2) for width in widths]
        total = sum(width + 3 for width in widths) + 1
        if self.title is not None:
            yield _centred(self.title, total)
        if self.show_header:
            yield "┏" + "┳".join(heavy) + "┓"
            yield "┃" + "┃".join(f" {_pad(cell, width)} " for cell, width in zip(self.columns, widths)) + "┃"
            yield "┡" + "╇".join(heavy) + "┩"
        else:
            yield "┌" + "┬".join(rules) + "┐"
        for row in self.rows:
            yield "│" + "│".join(f" {_pad(cell, width)} " for cell, width in zip(row, widths)) + "│"
        yield "└" + "┴".join(rules) + "┘"
        if self.caption is not None:
            yield _centred(self.caption, total)

    def render(self) -> str:
        return "\n".join(self.lines())
