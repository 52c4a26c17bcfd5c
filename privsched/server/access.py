"""Who may do what through the API, as exceptions that carry their HTTP status.

Roles (:data:`privsched.ledger.identities.ROLES`): viewers read the datasets their team
may use and the pipelines on them; submitters also submit, and cancel their own pipelines;
admins do everything, including what changes budget outside a pipeline (creating datasets
and blocks, unlocking budget), managing users, auditing, and reading job logs.
"""

from __future__ import annotations

from privsched.client import Client
from privsched.errors import BadInput, Conflict, Forbidden, NotFound, PrivschedError
from privsched.ledger import DatasetInfo, LedgerError, PipelineInfo
from privsched.ledger.identities import Identities, Submission, User, check_name


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


def require_owner(user: User, info: PipelineInfo, submission: Submission | None) -> None:
    """Admins manage every pipeline; a submitter only those it submitted."""
    if user.is_admin:
        return
    require_submitter(user)
    submitter = submission.submitter if submission is not None else None
    if submitter != user.name:
        raise Forbidden(f"pipeline {info.id} belongs to {submitter or info.owner}, not to {user.name}")


def require_result_reader(user: User, info: PipelineInfo, submission: Submission | None) -> None:
    """Who may read what a pipeline released (its result, its artifacts), the caller having
    reached the pipeline through its dataset (so being one of the dataset's readers): admins,
    its submitter, and, for a declarative job (a built-in kind: everything it releases is DP
    and was charged), every reader of the dataset. A code job's outputs reach only its
    submitter and admins (docs/privacy.md)."""
    if user.is_admin or info.job.get("kind"):
        return
    if submission is None or submission.submitter != user.name:
        raise Forbidden(f"pipeline {info.id} ran code: only its submitter and admins may read what it released")


def readable_dataset(client: Client, identities: Identities, user: User, name: str) -> DatasetInfo:
    """A dataset the user's team may use: 404 if there is none, 403 if it is not theirs."""
    try:
        info = client.ledger.get_dataset(name)
    except LedgerError:
        raise NotFound(f"unknown dataset {name!r}") from None
    if not identities.may_read(user, info.id):
        raise Forbidden(f"dataset {name!r} is limited to teams {', '.join(identities.dataset_teams(info.id))}")
    return info


def visible_message(info: PipelineInfo, user: User) -> str | None:
    """A pipeline's message, unless the job may have written it: a job is untrusted code,
    and the message of a pipeline it ended may quote raw data, so only admins read it."""
    if info.message is None or user.is_admin or info.state not in ("failed", "completed"):
        return info.message
    return "the job's message is shown to admins only"


def check_team(team: str) -> None:
    check_name(team, "team name")


def check_submission_id(text: str) -> None:
    if not 1 <= len(text) <= 128 or not text.isprintable():
        raise BadInput("a submission id must be 1-128 printable characters")


def check_same_submitter(user: User, submission: Submission | None, submission_id: str | None) -> None:
    """A submission id names one user's pipeline: another user may not reuse it (nor see it)."""
    if submission is not None and submission.submitter != user.name:
        raise Conflict(f"submission id {submission_id!r} is already used by another user")
