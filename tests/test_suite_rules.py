"""Rules the test suite keeps about itself: no property test has a deadline, so a loaded
machine makes the suite slower, never red (tests/support/profiles.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import settings

TESTS = Path(__file__).resolve().parent


def test_the_loaded_hypothesis_profile_has_no_deadline():
    assert settings.default.deadline is None
    assert settings.get_profile("dev").deadline is None and settings.get_profile("ci").deadline is None


def test_no_test_sets_a_hypothesis_deadline():
    set_deadlines = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "settings":
                for keyword in node.keywords:
                    if keyword.arg == "deadline" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
                        set_deadlines.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert set_deadlines == []
