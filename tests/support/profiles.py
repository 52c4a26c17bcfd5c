"""The Hypothesis profiles of the suite, loaded by ``tests/conftest.py`` before any test
module is imported, so that every ``settings(...)`` inherits from them.

No property test has a deadline: an example that takes long on a loaded machine is slow,
not wrong, and a wall-clock limit would make the suite's verdict depend on the machine's
load. ``dev`` is the default; ``ci`` (selected when the environment says ``CI=true``) runs
the randomised ledger state machines on more examples, the one place where more runs
catch more (:data:`LEDGER_MACHINE_EXAMPLES`)."""

from __future__ import annotations

import os

from hypothesis import settings

#: The profile in force: ``ci`` when ``CI=true``, else ``dev``.
PROFILE = "ci" if os.environ.get("CI", "").strip().lower() == "true" else "dev"

#: How many random operation sequences each ledger state machine runs under the profile.
LEDGER_MACHINE_EXAMPLES = {"dev": 20, "ci": 60}[PROFILE]


def load() -> None:
    """Register both profiles and load the one :data:`PROFILE` names."""
    settings.register_profile("dev", deadline=None)
    settings.register_profile("ci", deadline=None, print_blob=True)
    settings.load_profile(PROFILE)
