"""The ``-o``/``--output`` option: a command's answer as text (tables, for people), JSON or
YAML (for programs, as ``kubectl -o``), given before or after the command word.

JSON and YAML carry the same document: where the HTTP API has a model for the thing
printed (a pipeline, a dataset, a block), the document has that model's shape, so a
script reads ``privsched list -o json`` and ``GET /v1/pipelines`` alike. A value that is
not a format is a usage error (one line, exit 2), as click reports any bad choice.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Any, Optional

import typer


class Format(str, Enum):
    """How a command prints its answer."""

    text = "text"
    json = "json"
    yaml = "yaml"


OutputOption = Annotated[
    Optional[Format],
    typer.Option("--output", "-o", case_sensitive=False, help="Print as text, json or yaml (also before the command word)."),
]

#: The format given before the command word, if any (:func:`chosen`).
_before: dict[str, Format | None] = {"format": None}


def set_global(value: Format | None) -> None:
    """Record the ``-o`` given before the command word (the global options' callback)."""
    _before["format"] = value


def chosen(value: Format | None) -> Format:
    """The format of this command: its own ``-o``, else the one before the command word,
    else text."""
    return value or _before["format"] or Format.text


def emit(document: Any, fmt: Format) -> None:
    """Print ``document`` (JSON-compatible values) as JSON or YAML. Infinite and NaN floats
    (an unbounded share) are written as JSON's ``Infinity``/``NaN`` and YAML's ``.inf``/``.nan``."""
    if fmt is Format.yaml:
        import yaml

        print(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), end="", flush=True)
    else:
        print(json.dumps(document, ensure_ascii=False, allow_nan=True), flush=True)
