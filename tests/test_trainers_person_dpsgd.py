"""Person-level DP-SGD on a dataset whose unit is a person with K > 1 rows: Poisson sampling
over people (a person's rows all in a batch or none), each person's summed gradient clipped
to C, charged the subsampled Gaussian at the rate over people; a record-unit run unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from privsched import connect
from privsched.budgets import Accounting, EpsilonDelta, demand_vector, subsampled_gaussian_curve
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.primitives import Account
from privsched.jobs.runner import JobResult
from privsched.jobs.sandbox import abi_version
from privsched.trainers.builtin import plan_mechanism, run_builtin
from privsched.trainers.clipping import GhostClipping
from privsched.trainers.code_training import dp_sgd
from privsched.trainers.dpsgd import PoissonBatches, person_column, private_trainer
from privsched.trainers.people import PersonBatches, people_of, person_codes, person_split, sum_grad_samples
from privsched.trainers.plans import check_person_level, parse_job
from tests.support.tables import write_csv

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DELTA = 1e-6


def person_table(people: int, per_person: int, seed: int = 0) -> list[dict]:
    """``per_person`` rows of each of ``people`` people: a feature x in [0, 1] and a label y,
    1 when x > 0.5."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(people):
        for _ in range(per_person):
            x = float(rng.uniform(0, 1))
            rows.append({"uid": f"p{u}", "x": round(x, 6), "y": int(x > 0.5)})
    return rows


def user_dataset(tmp_path: Path, k: int, people: int = 60, per_person: int = 5) -> tuple[Path, object]:
    """A `user` dataset with K = ``k`` rows a person, its rows imported into two user blocks."""
    db = tmp_path / "p.db"
    with connect(db) as client:
        client.create_dataset("people", epsilon=10, delta=1e-7, unit="user", user_column="uid", max_rows_per_user=k)
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_table(people, per_person)), partitions=2, unlocked=1.0)
        return db, client.dataset("people")


JOB = {
    "kind": "dpsgd",
    "model": "logreg",
    "features": ["x"],
    "label": "y",
    "bounds": {"x": [0.0, 1.0]},
    "sample_rate": 0.2,
    "epochs": 1,
    "lr": 0.5,
    "people": 60,
}


def granted(db: Path, info, job: dict, workdir: Path, unit: str | None = None) -> JobContext:
    """A context granted every block of ``people`` with the job's plan as the grant."""
    with connect(db) as client:
        blocks = client.blocks("people")
    plan = plan_mechanism(job, 1.0, DELTA, info.accounting, info.max_rows_per_user)
    grant = demand_vector(plan, info.accounting)
    return JobContext(
        pipeline_id=1,
        name="p",
        dataset="people",
        accounting=info.accounting,
        delta=DELTA,
        blocks={b.key: BlockGrant(b.key, b.location, grant) for b in blocks},
        workdir=workdir,
        params=job,
        plan=plan,
        epsilon=1.0,
        unit=unit or info.unit,
        user_column=info.user_column,
        max_rows_per_user=info.max_rows_per_user,
    )


# -- clipping per person ---------------------------------------------------------------------------
def summed_gradient(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The gradient of the summed loss of ``inputs``, flattened (autograd, no clipping)."""
    model.zero_grad()
    nn.CrossEntropyLoss(reduction="sum")(model(inputs), labels).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def small_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 6), clip=st.floats(0.01, 10.0), scale=st.floats(0.1, 100.0), seed=st.integers(0, 2**16))
def test_a_persons_clipped_sum_over_k_rows_has_norm_at_most_c(k, clip, scale, seed):
    model = small_model(seed)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(k, 4, generator=generator) * scale
    labels = torch.randint(0, 3, (k,), generator=generator)
    GhostClipping(model, clip, nn.CrossEntropyLoss(reduction="sum")).accumulate(inputs, labels, torch.zeros(k, dtype=torch.long))
    clipped = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.linalg.vector_norm(clipped) <= clip * (1 + 1e-5)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_per_person_norms_are_the_norms_of_each_persons_summed_gradient(sizes, seed):
    model = small_model(seed)
    generator = torch.Generator().manual_seed(seed)
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    groups = groups[torch.randperm(len(groups), generator=generator)]  # a person's rows anywhere in the batch
    inputs = torch.randn(len(groups), 4, generator=generator)
    labels = torch.randint(0, 3, (len(groups),), generator=generator)
    norms, _ = GhostClipping(model, 1.0, nn.CrossEntropyLoss(reduction="sum")).per_example(inputs, labels, groups)
    for person in range(len(sizes)):
        mine = groups == person
        exact = torch.linalg.vector_norm(summed_gradient(model, inputs[mine], labels[mine]))
        assert torch.isclose(norms[person], exact, rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_hooks_mode_sums_each_persons_per_row_gradients_before_clipping():
    from opacus.grad_sample import GradSampleModule

    model = small_model(1)
    module = GradSampleModule(model, loss_reduction="sum")
    inputs, labels = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    groups = torch.tensor([1, 0, 1, 2, 0])
    nn.CrossEntropyLoss(reduction="sum")(module(inputs), labels).backward()
    sum_grad_samples(module, groups)
    for person in range(3):
        mine = groups == person
        expected = summed_gradient(small_model(1), inputs[mine], labels[mine])
        got = torch.cat([p.grad_sample[person].reshape(-1) for p in model.parameters()])
        assert torch.allclose(got, expected, atol=1e-6)


# -- sampling over people --------------------------------------------------------------------------
def test_poisson_batches_over_people_hold_all_of_a_persons_rows_or_none():
    people = np.array([3, 1, 3, 2, 1, 3, 0, 2])
    data = TensorDataset(torch.arange(8), torch.arange(8))
    batches = PersonBatches(data, people, 0.5)
    seen = set()
    for rows, _, groups in (batches.batch(batches.draw()) for _ in range(200)):
        chosen = set(people[rows.numpy()].tolist())
        assert sorted(rows.tolist()) == [i for i in range(8) if people[i] in chosen]
        for group in groups.unique().tolist():  # one batch index per person
            assert len(set(people[rows[groups == group].numpy()].tolist())) == 1
        assert len(groups.unique()) == len(chosen)
        seen.add(len(chosen))
    assert seen >= {0, 4}  # every subset size occurs: people are drawn independently


def test_people_join_a_batch_at_the_rate_q():
    people = np.repeat(np.arange(2000), 3)
    data = TensorDataset(torch.zeros(len(people)), torch.zeros(len(people)))
    batches = PersonBatches(data, people, 0.1)
    share = np.mean([batches.draw().mean() for _ in range(20)])
    assert abs(share - 0.1) < 0.01  # 40,000 draws: the standard error is 0.0015


def test_a_persons_rows_in_two_blocks_are_two_units_and_in_one_block_one():
    day1 = {"uid": np.array(["a", "b", "a"]), "x": np.array([1.0, 2.0, 3.0])}
    day2 = {"uid": np.array(["a", "c"]), "x": np.array([4.0, 5.0])}
    records, units = people_of([day1, day2], "uid")
    assert records["x"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert units[0] == units[2] and len(set(units.tolist())) == 4  # a on day 1, b, a on day 2, c


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=8), min_size=1, max_size=4))
def test_two_rows_share_a_unit_exactly_when_they_are_one_persons_in_one_block(blocks):
    parts = [{"uid": np.array(users, dtype=object), "x": np.zeros(len(users))} for users in blocks]
    _, units = people_of(parts, "uid")
    rows = [(b, user) for b, users in enumerate(blocks) for user in users]
    for i, first in enumerate(rows):
        for j, second in enumerate(rows):
            assert (units[i] == units[j]) == (first == second)


def test_blocks_without_the_user_column_are_refused():
    with pytest.raises(ValueError, match="no user column 'uid'"):
        people_of([{"x": np.ones(2)}], "uid")


def test_the_held_out_split_holds_out_whole_people():
    people = np.repeat(np.arange(300), 4)
    train, held = person_split(people, 0.3)
    assert not set(people[train]) & set(people[held])
    assert sorted(np.r_[train, held]) == list(range(len(people)))


def test_a_row_without_a_person_is_refused():
    with pytest.raises(ValueError, match="no user id"):
        person_codes(np.array(["a", None, "b"], dtype=object))


def test_the_trainer_samples_people_where_it_is_given_them_and_records_otherwise():
    job = parse_job(JOB)
    data = TensorDataset(torch.rand(12, 1), torch.randint(0, 2, (12,)))
    model = nn.Sequential(nn.Linear(1, 2))
    people = np.repeat(np.arange(4), 3)
    assert isinstance(private_trainer(model, data, job, 1.0, "ghost", torch.device("cpu"), 3, people=people).batches, PersonBatches)
    assert type(private_trainer(model, data, job, 1.0, "ghost", torch.device("cpu"), 3).batches) is PoissonBatches


# -- the job ---------------------------------------------------------------------------------------
def test_a_user_dataset_with_k_above_one_samples_people_and_a_record_or_k_one_dataset_records(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "w")
    assert person_column(ctx) == "uid"
    ctx.unit = "record"
    assert person_column(ctx) is None
    ctx.unit, ctx.max_rows_per_user = "user", 1
    assert person_column(ctx) is None


def test_a_person_level_plan_is_the_subsampled_gaussian_at_the_rate_over_people():
    accounting = Accounting.rdp()
    record = plan_mechanism(JOB, 1.0, DELTA, accounting, 1)
    person = plan_mechanism(JOB, 1.0, DELTA, accounting, 3)
    training = person.parts[0]
    assert (training.sample_rate, training.steps) == (0.2, 5) and person == record


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_built_in_dpsgd_on_a_user_dataset_with_k_three_spends_the_sgm_at_q_over_people(tmp_path, mode):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, {**JOB, "grad_sample_mode": mode}, tmp_path / "w")
    run_builtin(ctx)
    metrics = ctx.metrics
    assert metrics["sampled"] == "people" and metrics["steps"] == 5 and metrics["grad_sample_mode"] == mode
    sigma = ctx.plan.parts[0].noise_multiplier
    accuracy = demand_vector(EpsilonDelta(epsilon=metrics["accuracy_epsilon"]), info.accounting)
    assert np.allclose(ctx.spent, subsampled_gaussian_curve(0.2, sigma, 5, info.accounting.alphas) + accuracy, rtol=1e-12)
    assert json.loads((tmp_path / "w" / "metrics.json").read_text())["max_rows_per_user"] == 3


def test_person_level_logistic_regression_learns_at_epsilon_one(tmp_path):
    db, info = user_dataset(tmp_path, 3, people=1000, per_person=5)
    job = {**JOB, "people": 1000, "sample_rate": 0.05, "epochs": 3, "lr": 1.0}
    ctx = granted(db, info, job, tmp_path / "w")
    run_builtin(ctx)
    assert ctx.metrics["sampled"] == "people"
    # the label is x > 0.5 (chance 0.5); the model reaches about 0.99, and the released
    # accuracy's Laplace noise of scale K/ε_acc = 30 on ≈ 600 held-out rows brings it below 0.7
    # with probability about 2·10⁻⁴
    assert ctx.metrics["heldout_accuracy"] > 0.7


def test_a_record_unit_run_samples_records_and_spends_the_same_plan(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "w", unit="record")
    run_builtin(ctx)
    assert "sampled" not in ctx.metrics and ctx.metrics["steps"] == 5
    sigma = ctx.plan.parts[0].noise_multiplier
    accuracy = demand_vector(EpsilonDelta(epsilon=ctx.metrics["accuracy_epsilon"]), info.accounting)
    assert np.allclose(ctx.spent, subsampled_gaussian_curve(0.2, sigma, 5, info.accounting.alphas) + accuracy, rtol=1e-12)


def test_opacus_two_pass_ghost_clipping_is_refused_for_person_level_dp_sgd():
    with pytest.raises(ValueError, match="not opacus-ghost"):
        check_person_level(parse_job({**JOB, "grad_sample_mode": "opacus-ghost"}))


def test_a_person_unit_context_without_a_user_column_fails_before_reading_any_block(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "w")
    ctx.user_column = None
    with pytest.raises(ValueError, match="names no user column"):
        run_builtin(ctx)
    assert not ctx.touched_data


def test_a_job_without_a_public_divisor_fails_before_reading_any_block(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    job = {k: v for k, v in JOB.items() if k != "people"}
    ctx = granted(db, info, job, tmp_path / "w")
    with pytest.raises(ValueError, match="the number of people is not public"):
        run_builtin(ctx)
    assert not ctx.touched_data


def test_a_block_without_the_user_column_is_refused_before_the_jobs_first_data_access(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "w")
    ctx.user_column = "nobody"
    account = Account(ctx)
    with pytest.raises(ValueError, match="no user column 'nobody'"):
        account.open_block(ctx.block_keys[0])  # how a built-in job's supervisor hands it a block
    assert account.first_access is None and not account.read_blocks


def test_a_code_jobs_plan_on_blocks_without_the_user_column_is_refused_and_charges_nothing(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "w")
    ctx.user_column = "nobody"
    account = Account(ctx)
    with pytest.raises(ValueError, match="no user column 'nobody'"):
        account._dpsgd_plan({"sample_rate": 0.2, "epochs": 1})
    assert account.first_access is None and not np.any(account.spent)


# -- submitted and served --------------------------------------------------------------------------
def dpsgd_spec(path: Path, params: dict) -> Path:
    body = {k: v for k, v in params.items() if k != "kind"}
    path.write_text(
        "name: people-model\ndataset: people\nblocks: [u0, u1]\nepsilon: 1.0\ndelta: 1.0e-9\n"
        f"job: {{kind: dpsgd, params: {json.dumps(body)}}}\n"
    )
    return path


def test_a_person_level_dpsgd_job_without_a_public_divisor_is_refused_at_submit_in_one_line(tmp_path):
    from tests.cli_inprocess import invoke

    db, _ = user_dataset(tmp_path, 3)
    spec = dpsgd_spec(tmp_path / "job.yaml", {k: v for k, v in JOB.items() if k != "people"})
    refused = invoke("submit", str(spec), db=db)
    assert refused.code == 1 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: ") and "declare expected_batch_size" in refused.stderr
    with connect(db) as client:
        assert client.list() == []


@pytest.mark.slow
def test_built_in_dpsgd_on_a_user_dataset_with_k_three_completes_and_is_charged_its_plan(run_cli, tmp_path):
    from privsched.budgets.mechanisms import parse_mechanism

    db, info = user_dataset(tmp_path, 3)
    env = {"PRIVSCHED_DB": str(db)}
    assert run_cli("submit", dpsgd_spec(tmp_path / "job.yaml", JOB), env=env).returncode == 0
    served = run_cli("serve", "--until-idle", "--tick", "200ms", "--cpus", "1", "--gpus", "0", env=env)
    assert "pipeline 1 completed" in served.stdout + served.stderr, served.stderr
    with connect(db) as client:
        pipeline = client.status(1)
    training, accuracy = parse_mechanism(json.loads(pipeline.mechanism)).parts
    plan = subsampled_gaussian_curve(0.2, training.noise_multiplier, training.steps, info.accounting.alphas)
    charged = plan + demand_vector(accuracy, info.accounting)
    assert training.sample_rate == 0.2 and training.steps == 5
    for key in ("u0", "u1"):
        assert np.allclose(pipeline.consumed[key], charged, rtol=1e-9, atol=0)
    metrics = json.loads((tmp_path / "runs" / "p" / "1" / "work" / "metrics.json").read_text())
    assert metrics["sampled"] == "people" and metrics["steps"] == 5


# -- ctx.dp_sgd ------------------------------------------------------------------------------------
@pytest.mark.skipif(abi_version() == 0, reason="this kernel offers no Landlock sandbox")
def test_a_code_job_trains_per_person_on_a_user_dataset_and_is_charged_its_plan(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "work")
    ctx.params, ctx.plan = {}, None
    repo = Path(__file__).resolve().parents[1]
    document = {**json.loads(ctx.to_json()), "job": {"function": "tests.dpsgd_jobs:trains_people", "pythonpath": [str(repo)]}}
    (tmp_path / "context.json").write_text(json.dumps(document))
    command = [sys.executable, "-m", "privsched.jobs.runner", "context.json", "result.json"]
    subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)}, timeout=600, check=False)
    result = JobResult.from_json((tmp_path / "result.json").read_text())
    assert result.completed, result.message
    plan = result.metrics["dp_sgd"]
    expected = subsampled_gaussian_curve(0.2, plan["noise_multiplier"], 5, info.accounting.alphas)
    assert plan["sample_rate"] == 0.2 and plan["steps"] == 5
    for spent in result.spent.values():
        assert np.array_equal(np.asarray(spent), expected)


def test_a_code_job_on_a_user_dataset_cannot_train_on_tensors_that_name_no_person(tmp_path):
    db, info = user_dataset(tmp_path, 3)
    ctx = granted(db, info, JOB, tmp_path / "work")
    data = TensorDataset(torch.rand(4, 1), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="'data' names no person"):
        dp_sgd(ctx, nn.Linear(1, 2), data=data, sample_rate=0.2, epochs=1, lr=0.1)
    assert not ctx.touched_data
