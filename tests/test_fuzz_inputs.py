"""Property-based fuzzing of what users type and give: specifications, traces and command
lines, each built from valid inputs with hostile parts (markup, escape sequences, huge,
tiny, non-finite and boolean numbers, deep nesting, aliases, duplicate keys).

Every case must end in success or in exactly one ``error:`` line with a non-zero exit and
an unchanged database; a case that hangs never ends, so the suite would not either. Each
property runs a fixed number of cases, so the test costs the same in CI on every run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched.simulation.trace import TraceError, parse_trace
from privsched.text import is_unsafe
from tests.cli_inprocess import Outcome, invoke
from tests.conftest import dump_database

CASES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_NUMBERS = [
    True,
    False,
    None,
    0,
    -1,
    5e-324,
    1e-300,
    1e-9,
    1e300,
    float("inf"),
    float("-inf"),
    float("nan"),
    10**400,
    2**63,
    2**64,
    1.5,
    3,
]
HOSTILE_TEXT = [
    "[/]",
    "[bold]x",
    "\x1b[2J\x1b]0;t\x07",
    "\u202eevil",
    "a\rb",
    "",
    " ",
    "x" * 5000,
    "\udcff",
    "{key.__class__}",
    "{key[0]}",
    "{key}",
    "{dataset}/{key}",
    "..",
    "/dev/null",
    "-1",
    "1e300",
    "nan",
    "true",
    "1h",
    "99999999999999999999d",
    "4GiB",
    "1" * 500,
]
HOSTILE = st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXT + [nested(100), {"a": 1}, [], [1, 2]])
NUMBERS_AS_TEXT = st.sampled_from(["1", "0.5", "-1", "0", "1e-300", "5e-324", "1e300", "inf", "nan", "9" * 30, "true", "[/]", "", "0x10"])

BASE_SPEC = {
    "name": "p",
    "dataset": "d",
    "blocks": ["b0"],
    "epsilon": 0.1,
    "delta": 0.0,
    "job": {"function": "tests.service_jobs:spend_half"},
}
FIELDS = [
    "name",
    "dataset",
    "blocks",
    "epsilon",
    "delta",
    "mechanism",
    "timeout",
    "max_runtime",
    "weight",
    "owner",
    "resources",
    "job",
    "extra",
]
MECHANISMS = st.fixed_dictionaries(
    {"kind": st.sampled_from(["gaussian", "laplace", "subsampled_gaussian", "epsilon_delta", "explicit", "composed", "x"])},
    optional={
        "sigma": HOSTILE,
        "scale": HOSTILE,
        "sensitivity": HOSTILE,
        "sample_rate": HOSTILE,
        "noise_multiplier": HOSTILE,
        "steps": HOSTILE,
        "epsilon": HOSTILE,
        "delta": HOSTILE,
        "values": HOSTILE,
        "parts": HOSTILE,
    },
)
JOBS = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.just("dpsgd"), "model": st.just("logreg"), "lr": st.just(0.1)},
        optional={"sample_rate": HOSTILE, "epochs": HOSTILE, "seed": HOSTILE},
    ),
    st.fixed_dictionaries(
        {"kind": st.just("statistic"), "query": st.sampled_from(["count", "sum"])},
        optional={"column": HOSTILE, "bounds": HOSTILE, "seed": HOSTILE},
    ),
    st.fixed_dictionaries({"function": HOSTILE}, optional={"params": HOSTILE, "pythonpath": HOSTILE}),
)
RESOURCES = st.fixed_dictionaries({}, optional={"gpus": HOSTILE, "cpus": HOSTILE, "memory": HOSTILE})
VALUES = {
    "mechanism": MECHANISMS,
    "job": JOBS,
    "resources": RESOURCES,
    "blocks": st.one_of(HOSTILE, st.fixed_dictionaries({"last": HOSTILE}), st.fixed_dictionaries({"from": HOSTILE, "to": HOSTILE})),
}


@st.composite
def specs(draw: st.DrawFn) -> dict:
    spec = dict(BASE_SPEC)
    for field in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True)):
        spec[field] = draw(VALUES.get(field, HOSTILE))
    if "mechanism" in spec:
        spec.pop("epsilon"), spec.pop("delta")
    return spec


def spec_text(spec: dict, form: str) -> str:
    if form == "json":
        return json.dumps(spec)
    if form == "yaml":
        return yaml.safe_dump(spec, allow_unicode=True)
    # YAML with an alias, or a key given twice
    body = yaml.safe_dump(spec, allow_unicode=True)
    return body + ("name: again\n" if form == "duplicate" else "params: &x [1, 2]\nother: *x\n")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with a basic dataset ``d`` (blocks b0, b1 unlocked) and an RDP dataset ``r``."""
    db = tmp_path_factory.mktemp("fuzz") / "template.db"
    for args in (
        ["init"],
        ["dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6", "--accounting", "basic"],
        ["blocks", "add", "d", "b0", "b1", "--unlocked", "1"],
        ["dataset", "create", "r", "--epsilon", "10", "--delta", "1e-7"],
        ["blocks", "add", "r", "b0"],
    ):
        assert invoke(*args, db=db).code == 0
    return db


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cases")


def fresh_copy(template: Path, scratch: Path) -> Path:
    db = scratch / "case.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(template, db)
    return db


def check_outcome(outcome: Outcome, db: Path, before: list[str]) -> None:
    """Success, or one safe error line, a non-zero exit and the database as it was."""
    assert not [c for c in outcome.stderr if c != "\n" and is_unsafe(c)], outcome.stderr
    if outcome.code == 0:
        return
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
    assert dump_database(db) == before


@CASES
@given(
    spec=specs(),
    form=st.sampled_from(["json", "yaml", "alias", "duplicate"]),
    dataset=st.sampled_from(["d", "r"]),
    owner=st.one_of(st.none(), st.sampled_from(HOSTILE_TEXT)),
)
def test_any_specification_is_submitted_or_refused_in_one_line(template, scratch, spec, form, dataset, owner):
    db = fresh_copy(template, scratch)
    if spec.get("dataset") == "d":
        spec["dataset"] = dataset
    path = scratch / ("spec.json" if form == "json" else "spec.yaml")
    try:
        path.write_text(spec_text(spec, form), errors="surrogateescape")
    except ValueError:  # NaN in strict JSON output is fine to skip: the loader's own test covers it
        return
    before = dump_database(db)
    outcome = invoke("submit", path, *(["--owner", owner] if owner is not None else []), db=db)
    check_outcome(outcome, db, before)
    if outcome.code == 0:
        assert outcome.stdout.strip().isdigit() and form in ("json", "yaml")


BASE_TRACE = {
    "accounting": "basic",
    "blocks": [{"id": "b0", "arrival": 0.0, "epsilon": 1.0, "delta": 1e-6}],
    "pipelines": [{"id": "p0", "arrival": 1.0, "blocks": ["b0"], "epsilon": 0.1, "timeout": 10}],
}
TRACE_FIELDS = {
    "blocks": ["id", "arrival", "epsilon", "delta"],
    "pipelines": ["id", "arrival", "blocks", "epsilon", "delta", "demands", "curve", "mechanism", "weight", "timeout", "class"],
}


@st.composite
def traces(draw: st.DrawFn) -> dict:
    trace = json.loads(json.dumps(BASE_TRACE))
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["blocks", "pipelines", "top"]))
        if part == "top":
            trace[draw(st.sampled_from(["accounting", "alphas", "blocks", "pipelines", "x"]))] = draw(HOSTILE)
        elif isinstance(trace.get(part), list) and trace[part] and isinstance(trace[part][0], dict):
            trace[part][0][draw(st.sampled_from(TRACE_FIELDS[part]))] = draw(
                MECHANISMS if part == "pipelines" and draw(st.booleans()) else HOSTILE
            )
    return trace


@CASES
@given(trace=traces())
def test_any_trace_loads_and_simulates_or_is_refused_in_one_line(trace):
    try:
        loaded = parse_trace(trace)
    except TraceError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    from privsched.simulation.api import resolve_policy, run

    result = run("fuzz", loaded.instance, resolve_policy("fcfs"))
    assert len(result.status) == len(loaded.pipelines)


@st.composite
def command_lines(draw: st.DrawFn, scratch: Path) -> list[str]:
    x, y = draw(st.sampled_from(HOSTILE_TEXT)), draw(NUMBERS_AS_TEXT)
    out = draw(st.sampled_from([str(scratch / "out"), str(scratch / "case.db"), "/dev/null/x", "/dev/null", str(scratch)]))
    return draw(
        st.sampled_from(
            [
                ["dataset", "create", x, "--epsilon", y, "--delta", draw(NUMBERS_AS_TEXT)],
                ["dataset", "create", "n", "--epsilon", "1", "--delta", "1e-6", "--alphas", x],
                ["blocks", "add", "d", x],
                ["blocks", "add", "d", "k", "--location-template", x],
                ["blocks", "add", "d", "k", "--location", x],
                ["blocks", "add", "d", "k", "--unlocked", y],
                ["blocks", "list", x],
                ["budget", "show", x],
                ["blocks", "list", "--all"],
                ["status", y],
                ["cancel", y],
                ["logs", y],
                ["list", "--state", x],
                ["list", "--dataset", x],
                ["trace", "single-block", "--out", out, "--duration", y],
                ["trace", "single-block", "--out", out, "-p", f"rate={y}"],
                ["trace", "multi-block", "--out", out, "-p", f"initial_blocks={y}", "--duration", "5"],
                ["trace", "single-block", "--out", out, "-p", "rate=1", "-p", f"rate={y}"],
                ["trace", "single-block", "--out", out, "-p", f"{x}=1"],
                ["simulate", "single-block", "--out", out, "--policy", "dpf-t", "--lifetime", "10", "--tick", y, "--duration", "5"],
            ]
        )
    )


@CASES
@given(data=st.data())
def test_any_command_line_succeeds_or_fails_in_one_line(template, scratch, data):
    db = fresh_copy(template, scratch)
    args = data.draw(command_lines(scratch))
    before = dump_database(db)
    outcome = invoke(*args, db=db if args[0] not in ("trace", "simulate") else None)
    check_outcome(outcome, db, before)


@pytest.mark.parametrize(
    "args, reason",
    [
        (["trace", "single-block", "--out", "{folder}"], "is a folder"),
        (["simulate", "single-block", "--out", "{file}"], "not a folder"),
        (["simulate", "single-block", "--out", "/dev/null/x"], "folder"),
        (["trace", "single-block", "--out", "/dev/null/x"], "folder"),
        (["trace", "single-block", "--out", "{folder}/t.json", "-p", "rate=1e9"], "limit of 1000000"),
        (["trace", "multi-block", "--out", "{folder}/t.json", "-p", "initial_blocks=1e9"], "100000"),
        (["trace", "single-block", "--out", "{folder}/t.json", "-p", "rate=1", "-p", "rate=2"], "given twice"),
        (["trace", "single-block", "--out", "{folder}/t.json", "-p", "seed=3"], "--seed"),
        (["simulate", "single-block", "--out", "{folder}/s", "--policy", "dpf-t", "--lifetime", "10", "--tick", "1e-9"], "unlock ticks"),
        (["simulate", "single-block", "--out", "{folder}/s", "--duration", "nan"], "finite"),
        (["serve", "--cpus", "nan", "--db", "{db}"], "finite"),
        (["serve", "--gpus", "100000000000000000000", "--db", "{db}"], "[0, 1024]"),
        (["serve", "--cpus", "1e-9", "--db", "{db}"], "[0.01, 4096]"),
        (["list", "--db", "{folder}/loop"], "cannot open"),
        (["init", "--db", "{folder}/loop/x.db"], "cannot open"),
        (["init", "--db", "/dev/null"], "not a regular file"),
    ],
)
def test_unusable_simulation_serve_and_path_inputs_are_refused_naming_the_limit(template, tmp_path, args, reason):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    db = fresh_copy(template, tmp_path)
    before = dump_database(db)
    values = {"folder": str(tmp_path), "file": str(tmp_path / "a-file"), "db": str(db)}
    outcome = invoke(*(arg.format(**values) for arg in args))
    assert outcome.code != 0 and outcome.stderr.count("\n") == 1 and reason in outcome.stderr, outcome.stderr
    assert dump_database(db) == before
    assert not (tmp_path / "s").exists() and not (tmp_path / "t.json").exists()
