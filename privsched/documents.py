"""Reading documents that users give (pipeline specifications, traces): bounded and strict.

- The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before any read, so a
  FIFO, a device or a folder is refused without blocking, and a file over the caller's size
  cap is refused before it is read.
- YAML is read with PyYAML's safe loader, refusing aliases (an alias bomb expands a few
  hundred bytes into gigabytes), duplicate keys (which YAML would silently overwrite) and
  nesting deeper than :data:`MAX_DEPTH`.
- JSON likewise refuses duplicate keys, ``NaN``/``Infinity`` and deep nesting.
Every problem raises :class:`DocumentError` with one line naming the file. PyYAML is
imported only to read YAML (:mod:`privsched.strict_yaml`): a JSON document never loads it.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

#: Deepest nesting of mappings and lists accepted in a document.
MAX_DEPTH = 32


class DocumentError(ValueError):
    """A document that cannot be read or parsed (one-line message)."""


def read_text(path: str | Path, limit: int) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes, read without blocking."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DocumentError(f"cannot read {path}: not a regular file")
        if info.st_size > limit:
            raise DocumentError(f"{path} is {info.st_size} bytes, more than the {limit}-byte limit")
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise DocumentError(f"{path} is more than the {limit}-byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def check_depth(data: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse mappings and lists nested deeper than ``limit`` (checked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > limit:
                raise DocumentError(f"{where}: nested more than {limit} levels deep")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def parse_yaml(text: str, where: str) -> Any:
    """One YAML document, strictly (see the module docstring)."""
    import yaml

    from privsched.strict_yaml import StrictLoader

    try:
        return yaml.load(text, Loader=functools.partial(StrictLoader, max_depth=MAX_DEPTH))  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DocumentError(f"{where}: invalid YAML{at}: {problem}") from None
    except (ValueError, TypeError) as exc:  # e.g. an integer beyond Python's digit limit
        raise DocumentError(f"{where}: invalid YAML: {exc}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    data: dict = {}
    for key, value in pairs:
        if key in data:
            raise DocumentError(f"duplicate key {key!r}")
        data[key] = value
    return data


def _no_constant(name: str) -> Any:
    raise DocumentError(f"{name} is not a number")


def parse_json(text: str, where: str) -> Any:
    """One JSON document, strictly (see the module docstring)."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{where}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # DocumentError from the hooks, or an integer beyond the digit limit
        raise DocumentError(f"{where}: invalid JSON: {exc}") from None
    check_depth(data, where)
    return data
