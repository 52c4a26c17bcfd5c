"""Who may do what through the API, as exceptions that carry their HTTP status.

Roles (:data:`privsched.ledger.identities.ROLES`): viewers read the datasets their team
may use and the pipelines on them; submitters also submit, and cancel their own pipelines;
admins do everything, including what changes budget outside a pipeline (creating datasets
and blocks, unlocking budget), managing users, auditing, and reading job logs.

What a job released or wrote has an owner (docs/privacy.md, "Who may run what"): a
*declarative* job's (built-in statistics and DP-SGD) outputs are DP and charged, so every
reader of its dataset may read them, while its log and its own failure message, written by
privsched's code as it read raw data, are for admins only; a *code* job's (``function:``) metrics,
messages and logs reach only its submitter, who wrote the trusted code, and admins. What
privsched itself decided about a pipeline (never grantable, timed out, cancelled, not
started, ...) is read from public budgets and clocks, and every reader sees it.
"""

from __future__ import annotations

from privsched.client import Client
from privsched.errors import BadInput, Conflict, Forbidden, NotFound, PrivschedError
from privsched.ledger.reads import unknown_dataset
from privsched.ledger import DatasetInfo, LedgerError, PipelineInfo
from privsched.ledger.identities import Identities, Submission, User, check_name
from privsched.spec import JobSpec

#: What a reader who may not read a job's own words sees in place of its failure message.
WITHHELD = "the job failed with an error of its own, shown to its submitter and admins only"
#: The same, for a declarative job, whose own messages only admins read.
WITHHELD_BUILTIN = "the built-in job failed with an error of its own, shown to admins only (it may quote data)"


#: A refused request; ``status`` is its HTTP status code (docs/design.md §6.3).
ApiError = PrivschedError


class Unauthorized(PrivschedError):
    """A request without a live bearer token."""

    status = 401


def authenticate(identities: Identities, header: str | None) -> User:
    """The user of an ``Authorization: Bearer <token>`` header; 401 if none or not live."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    user = identities.authenticate(token.strip())
    if user is None:
        raise Unauthorized("unknown or revoked token")
    return user


def require_admin(user: User, action: str) -> None:
    if not user.is_admin:
        raise Forbidden(f"only an admin may {action} (you are {user.name}, {user.role})")


def require_submitter(user: User) -> None:
    if user.role not in ("submitter", "admin"):
        raise Forbidden(f"only a submitter or an admin may submit pipelines (you are {user.name}, {user.role})")


def require_code_rights(user: User, job: JobSpec) -> None:
    """A code job (``function:``) only from a user an admin allowed (``--code``) or an admin."""
    if job.function is not None and not user.may_run_code:
        raise Forbidden(
            f"{user.name} may not submit code jobs (function:): an admin allows it with `privsched user allow-code {user.name}`"
        )


def is_code_job(info: PipelineInfo) -> bool:
    """Whether a pipeline runs its submitter's code (``function:``) rather than a built-in job."""
    return not info.job.get("kind")


def is_submitter(user: User, submission: Submission | None) -> bool:
    return submission is not None and submission.submitter == user.name


def can_read_outputs(user: User, info: PipelineInfo, submission: Submission | None) -> bool:
    """Whether ``user``, who may read the dataset of pipeline ``info`` (submitted as
    ``submission``), may read what its job released: metrics, results, artifacts. Admins and
    its submitter may; for a declarative job every reader of the dataset may (what it
    releases is DP and charged); a code job's outputs reach no one else."""
    return user.is_admin or is_submitter(user, submission) or not is_code_job(info)


def can_read_job_text(user: User, info: PipelineInfo, submission: Submission | None) -> bool:
    """Whether ``user`` may read what a pipeline's job wrote itself (its log, its own failure
    message): admins, and a code job's submitter (the code is theirs). A declarative job's
    log and exceptions come from privsched's code over raw data: admins only."""
    return user.is_admin or (is_code_job(info) and is_submitter(user, submission))


def require_job_text(user: User, info: PipelineInfo, submission: Submission | None) -> None:
    """403 unless :func:`can_read_job_text`."""
    if not can_read_job_text(user, info, submission):
        whose = "its submitter and admins" if is_code_job(info) else "admins"
        raise Forbidden(f"the log of pipeline {info.id} is for {whose} only")


def written_by_job(message: str | None) -> bool:
    """Whether a failure message holds the job's own words (:data:`JOB_RAISED`)."""
    from privsched.jobs.runner import JOB_RAISED

    return message is not None and message.startswith(JOB_RAISED)


def visible_message(info: PipelineInfo, user: User, submission: Submission | None) -> str | None:
    """A pipeline's message as ``user`` may read it: what privsched decided, to every reader;
    what the job wrote, to those who may read its text (:func:`can_read_job_text`)."""
    if not written_by_job(info.message) or can_read_job_text(user, info, submission):
        return info.message
    return WITHHELD if is_code_job(info) else WITHHELD_BUILTIN


def require_owner(user: User, info: PipelineInfo, submission: Submission | None) -> None:
    """Admins manage every pipeline; a submitter only those it submitted."""
    if user.is_admin:
        return
    require_submitter(user)
    submitter = submission.submitter if submission is not None else None
    if submitter != user.name:
        raise Forbidden(f"pipeline {info.id} belongs to {submitter or info.owner}, not to {user.name}")


def require_result_reader(user: User, info: PipelineInfo, submission: Submission | None) -> None:
    """403 unless ``user`` may read what a pipeline released (:func:`can_read_outputs`), the
    caller having reached the pipeline through its dataset (so being one of its readers)."""
    if not can_read_outputs(user, info, submission):
        raise Forbidden(f"pipeline {info.id} ran code: only its submitter and admins may read what it released")


def readable_dataset(client: Client, identities: Identities, user: User, name: str) -> DatasetInfo:
    """A dataset the user's team may use: 404 if there is none, 403 if it is not theirs."""
    try:
        info = client.ledger.get_dataset(name)
    except LedgerError:  # suggest only a dataset the caller may read: names are not for every team
        readable = [d.name for d in client.datasets() if identities.may_read(user, d.id)]
        raise NotFound(unknown_dataset(name, readable)) from None
    if not identities.may_read(user, info.id):
        raise Forbidden(f"dataset {name!r} is limited to teams {', '.join(identities.dataset_teams(info.id))}")
    return info


def check_team(team: str) -> None:
    check_name(team, "team name")


def check_submission_id(text: str) -> None:
    if not 1 <= len(text) <= 128 or not text.isprintable():
        raise BadInput("a submission id must be 1-128 printable characters")


def check_same_submitter(user: User, submission: Submission | None, submission_id: str | None) -> None:
    """A submission id names one user's pipeline: another user may not reuse it (nor see it)."""
    if submission is not None and submission.submitter != user.name:
        raise Conflict(f"submission id {submission_id!r} is already used by another user")
