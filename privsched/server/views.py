"""What the routes answer about datasets and pipelines, with who may read them."""

from __future__ import annotations

from privsched.client import Client
from privsched.ledger import LedgerError, PipelineInfo
from privsched.ledger.identities import Identities, Submission, User
from privsched.server import access
from privsched.server.access import NotFound
from privsched.server.models import BlockDemandOut, DatasetOut, PipelineOut, ResultOut


class Views:
    """Reads of ``client`` and ``identities`` shaped as the API's answers."""

    def __init__(self, client: Client, identities: Identities) -> None:
        self.client = client
        self.identities = identities

    def dataset(self, name: str, caller: User) -> DatasetOut:
        info = access.readable_dataset(self.client, self.identities, caller, name)
        return DatasetOut.of(info, self.identities.dataset_teams(info.id), self.client.dataset_schema(info.name))

    def pipeline(self, pipeline_id: int, caller: User) -> PipelineInfo:
        """A pipeline on a dataset the caller may read: 404 if there is none, 403 if not."""
        try:
            info = self.client.status(pipeline_id)
        except LedgerError:
            raise NotFound(f"unknown pipeline {pipeline_id}") from None
        access.readable_dataset(self.client, self.identities, caller, info.dataset)
        return info

    def status(self, pipeline_id: int, caller: User) -> PipelineOut:
        return self.pipeline_out(self.pipeline(pipeline_id, caller), caller)

    def pipeline_out(self, info: PipelineInfo, caller: User) -> PipelineOut:
        """One pipeline as the API answers it, with its demand per block in people's terms
        (ε at the dataset's δ_G and the share of each block it takes)."""
        submission = self.identities.submissions([info.id]).get(info.id)
        out = PipelineOut.of(info, submission.team if submission else None, access.visible_message(info, caller, submission))
        out.budget = BlockDemandOut.of_pipeline(info, self.client.dataset(info.dataset))
        return out

    def result_reader(self, pipeline_id: int, caller: User) -> tuple[PipelineInfo, Submission | None]:
        """A pipeline whose outputs the caller may read (:func:`access.require_result_reader`),
        and who submitted it."""
        info = self.pipeline(pipeline_id, caller)
        submission = self.identities.submissions([info.id]).get(info.id)
        access.require_result_reader(caller, info, submission)
        return info, submission

    def result(self, pipeline_id: int, caller: User) -> ResultOut:
        """What a pipeline released, for a caller who may read it, with its reason as
        :func:`access.visible_message` shows it to the caller."""
        info, submission = self.result_reader(pipeline_id, caller)
        result = self.client.result(pipeline_id)
        reason = access.visible_message(info, caller, submission)
        return ResultOut.model_validate({**result.to_dict(), "reason": reason})
