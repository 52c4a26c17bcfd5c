"""What the routes answer about datasets and pipelines, with who may read them."""

from __future__ import annotations

from privsched.client import Client
from privsched.ledger import LedgerError, PipelineInfo
from privsched.ledger.identities import Identities, User
from privsched.server import access
from privsched.server.access import NotFound
from privsched.server.models import DatasetOut, PipelineOut


class Views:
    """Reads of ``client`` and ``identities`` shaped as the API's answers."""

    def __init__(self, client: Client, identities: Identities) -> None:
        self.client = client
        self.identities = identities

    def dataset(self, name: str, caller: User) -> DatasetOut:
        info = access.readable_dataset(self.client, self.identities, caller, name)
        return DatasetOut.of(info, self.identities.dataset_teams(info.id))

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
        submission = self.identities.submissions([info.id]).get(info.id)
        return PipelineOut.of(info, submission.team if submission else None, access.visible_message(info, caller, submission))
