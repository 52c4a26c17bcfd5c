"""Reading a pipeline specification file, before its validation (:mod:`privsched.spec`),
without pydantic: a remote client sends a valid file as read (:mod:`privsched.remote`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from privsched.documents import parse_json, parse_yaml, read_text
from privsched.errors import BadInput

#: Largest specification file read, in bytes.
MAX_SPEC_BYTES = 2**20


class SpecError(BadInput):
    """A pipeline specification that cannot be loaded or is invalid (one-line message)."""


def read_spec(path: str | os.PathLike) -> Any:
    """The document of a specification file, not yet validated: a ``.json`` file as JSON,
    any other as YAML, read strictly (:mod:`privsched.documents`: a regular file of at most
    ``MAX_SPEC_BYTES``, no YAML aliases, no duplicate keys, bounded nesting)."""
    path = Path(path)
    try:
        text = read_text(path, MAX_SPEC_BYTES)
        return parse_json(text, str(path)) if path.suffix == ".json" else parse_yaml(text, str(path))
    except ValueError as exc:
        raise SpecError(str(exc)) from None
