"""Validating a pipeline specification does no start-up work a submission need not pay for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .conftest import REPO

#: Validates a DP-SGD specification in a fresh interpreter and prints whether the standard
#: tokenizer compiled its pattern (it does when pydantic reads a builtin default factory's
#: signature from its text, about 2 ms).
PROBE = """
import json, tokenize
from privsched.spec import PipelineSpec
spec = PipelineSpec.parse({"name": "mlp", "dataset": "reviews", "blocks": {"last": 10}, "epsilon": 1.0, "delta": 1e-9,
                           "job": {"kind": "dpsgd", "params": {"model": "mlp"}}})
print(json.dumps([spec.job.params, spec.job.pythonpath, tokenize._compile.cache_info().currsize]))
"""


def test_validating_a_specification_tokenizes_no_signature():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [{"model": "mlp"}, [], 0]
