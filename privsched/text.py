"""User text at the edges: what a name may contain, how any stored text is shown, and the
one template users write (block locations, :func:`fill_template`).

Names, keys and owners are typed by users and later printed on other users' terminals.
Characters that can drive a terminal or reorder what it shows are therefore refused in
names and escaped wherever text is printed:
- C0 and C1 control characters and DEL (Unicode category ``Cc``: ESC starts every
  terminal escape sequence, CR and backspace overwrite what is shown);
- lone surrogates (``Cs``, from undecodable bytes), which cannot be encoded for output;
- line and paragraph separators (``Zl``, ``Zp``);
- the bidirectional formatting characters (Unicode TR9 §2: LRM, RLM, ALM, the embeddings,
  overrides and isolates), which make text display in another order than it is stored
  ("Trojan Source", Boucher & Anderson 2021).
"""

from __future__ import annotations

import re
import unicodedata

#: Unicode categories never allowed in a name and always escaped when shown.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
#: Bidirectional formatting characters (Unicode TR9 §2).
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: Longest name, key or owner accepted, in characters.
MAX_NAME_LENGTH = 256


def is_unsafe(char: str) -> bool:
    """Whether one character may change how a terminal shows what follows it."""
    return char in BIDI_CONTROLS or unicodedata.category(char) in UNSAFE_CATEGORIES


def escape_char(char: str) -> str:
    """``\\xNN`` below U+0100, ``\\uNNNN`` above (Python's own escape forms)."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object, keep: str = "") -> str:
    """``value`` as text that is safe to print: every unsafe character (see the module
    docstring) escaped, except those in ``keep`` (e.g. newlines in a job's log)."""
    text = str(value)
    if text.isascii() and text.isprintable():  # no Cc character below U+0080, and nothing else is unsafe there
        return text
    if not any(is_unsafe(c) for c in text):
        return text
    return "".join(c if c in keep or not is_unsafe(c) else escape_char(c) for c in text)


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a name (dataset, block key, pipeline, owner), or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    if len(value) > MAX_NAME_LENGTH:
        return f"is {len(value)} characters long, at most {MAX_NAME_LENGTH} are allowed"
    bad = next((c for c in value if is_unsafe(c)), None)
    if bad is not None:
        return f"contains the control character {escape_char(bad)}"
    return None


_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def fill_template(template: str, **fields: str) -> str:
    """``template`` with each ``{name}`` replaced by ``fields[name]`` and ``{{``/``}}`` by
    braces. Only plain names are substituted (no attribute, index or format spec, unlike
    ``str.format``); any other brace raises ``ValueError`` naming the fields allowed."""

    def substitute(match: re.Match) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name is None or name not in fields:
            allowed = ", ".join(f"{{{f}}}" for f in fields)
            raise ValueError(f"the template may only use {allowed} (and {{{{ }}}} for braces), got {printable(token)!r}")
        return fields[name]

    return _FIELD.sub(substitute, template)
