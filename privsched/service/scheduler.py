"""The scheduling tick: unlock, expire, admit (order with the policy, commit the grants),
place granted jobs on free compute, collect finished jobs and settle them (docs/design.md §4.3–4.4).

The scheduler keeps no budget of its own: every move goes through the ledger, so a
restarted scheduler resumes from the ledger alone (:meth:`Scheduler.recover`).

Unlocking is idempotent. Each block's unlocked fraction is raised to what the unlock rule
implies since the block's creation (:func:`privsched.policies.unlock.unlocked_fraction`, the
simulator's computation too): ``on_block_created() + arrivals × on_pipeline_arrival()
+ on_tick(now − created_at)``, capped at 1, where arrivals counts the pipelines that ever
asked for the block. Whatever a crashed scheduler already unlocked is read back from the
ledger (the block's locked budget), so a restart never unlocks the same arrival or the
same span of time twice, and a per-time block is fully unlocked its lifetime after its
creation (docs/design.md §4.1).

Round robin's water-filled reservations (Snapshot.reserved) live in the scheduler's memory
only (with a copy in the runs folder for the waiting reasons of every client): the ledger
still counts them as unlocked, a granted pipeline's reservation becomes its allocation, and
reservations of a timed-out pipeline, or all of them after a restart, return to the
unlocked pool rather than being lost.
"""

from __future__ import annotations

import json
import secrets
import socket
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from pydantic import ValidationError

from privsched.budgets.accounting import leq
from privsched.budgets.elastic import granted_epsilon
from privsched.budgets.mechanisms import parse_mechanism
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult, write_atomic
from privsched.ledger import Ledger, LedgerError
from privsched.ledger.errors import StorageFull
from privsched.ledger.fingerprints import data_problem
from privsched.ledger.launches import LaunchRecord
from privsched.ledger.models import PipelineInfo
from privsched.errors import validation_message
from privsched.policies.base import PolicySpec, orders_per_pipeline
from privsched.policies.unlock import UnlockGrid, unlock_amounts, unlocked_fraction
from privsched.service.executors.base import Executor, Launch
from privsched.service.launching import LaunchFiles
from privsched.service.pending import Marks, PendingSet
from privsched.service.preflight import input_problem
from privsched.service.resources import FreeCompute, Placement, Pool
from privsched.service.rundirs import RunDirs
from privsched.service.settle import settle, settle_together
from privsched.service.snapshot import edge_keys, edge_reservations, snapshot_of
from privsched.service.unsatisfiable import never_grantable
from privsched.service import wakeup
from privsched.spec import Resources


@dataclass
class TickReport:
    """What one tick did, and what is left."""

    unlocked: int = 0  # blocks with budget unlocked
    expired: list[int] = field(default_factory=list)
    granted: list[int] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    settled: list[int] = field(default_factory=list)
    pending: int = 0
    waiting: int = 0  # granted, waiting for compute
    running: int = 0
    more_to_unlock: bool = False  # a per-time rule still has locked budget to release
    reserved_changed: bool = False

    @property
    def idle(self) -> bool:
        """Nothing runs or waits for compute, and no pending pipeline can progress without a
        new event (a submission, a block, released budget)."""
        if self.running or self.waiting:
            return False
        stalled = not (self.unlocked or self.expired or self.granted or self.settled or self.reserved_changed)
        return self.pending == 0 or (stalled and not self.more_to_unlock)


class Scheduler:
    """One database's scheduler: a policy, an executor and a compute pool over a ledger."""

    def __init__(
        self,
        ledger: Ledger,
        policy: PolicySpec,
        executor: Executor,
        pool: Pool,
        runs: RunDirs,
        log: Callable[[str], None] = lambda message: None,
        unlock_grid: UnlockGrid | None = None,
    ) -> None:
        self.ledger = ledger
        self.unlock_grid = unlock_grid  # per-time unlocking at these instants only (None: continuously)
        self.policy = policy
        self.executor = executor
        self.compute = FreeCompute(pool)
        self.runs = runs
        self.launches = LaunchFiles(runs.root)
        self.log = log
        self.pending = PendingSet(ledger)  # pending pipelines and block balances, read incrementally
        self._unchecked = Marks(everything=True)  # changes not yet looked at for hopeless pipelines
        self._unadmitted = Marks(everything=True)  # changes not yet looked at by an allocation pass
        self._unretired = Marks(everything=True)  # changes not yet looked at for exhausted blocks
        self._reread = False  # the ledger refused a grant: the next tick reads everything again
        self._reserved: dict[tuple[int, int], np.ndarray] = {}  # (pipeline id, block id) -> budget
        self._locations: dict[str, dict[str, str | None]] = {}  # dataset -> block key -> location
        self._fingerprints: dict[str, dict[str, str | None]] = {}  # dataset -> block key -> SHA-256 of its data
        self._unresolved: dict[int, tuple[PipelineInfo, LaunchRecord]] = {}  # launches left mid-way
        self._unsettled: dict[int, JobResult] = {}  # ended jobs whose settling the ledger refused for lack of space

    # -- start-up ---------------------------------------------------------------------------

    def recover(self, now: float) -> None:
        """Resume from the ledger (on taking the lease over): count every arrival so far, and
        adopt the jobs of running pipelines. A job whose launch was recorded as started is
        watched (or settled); one left ``launching`` is resolved by :meth:`resolve_launches`
        at the start of every tick.
        Granted jobs not started yet are placed by the next tick like any other."""
        self.pending.rebuild()
        self._refresh()
        self.runs.record_reservations({})  # an earlier scheduler's reservations died with it
        running = self.ledger.list_pipelines(states=["running"])
        records = self.ledger.launch_records([info.id for info in running])
        for info in running:
            placement = Placement.from_record(info.placement)
            self.compute.hold(info.id, placement)
            record = records.get(info.id)
            if record is not None and record.state == "launching":
                self._unresolved[info.id] = (info, record)
                continue
            token = None if record is None else record.token
            if record is not None and record.pid is not None:
                # The ledger's pid, not the run folder's file, which the job itself may write.
                write_atomic(self.runs.pid_file(info.id), f"{record.pid} {record.start_ticks or ''}\n")
            alive = self.executor.attach(self._launch(info, placement, info.started_at or now, token))
            self.log(f"pipeline {info.id} was running before the restart: " + ("still running" if alive else "ended"))

    def resolve_launches(self, now: float) -> None:
        """Settle launches an earlier scheduler left mid-way, each once its launch lock is
        free (module :mod:`~privsched.service.launching`): never spawned → released; spawned
        → adopted (its process found by pid or launch token), or settled from its result, or
        charged in full when it ended without one (docs/design.md §4.4)."""
        for pipeline_id, (info, record) in list(self._unresolved.items()):
            lock = self.launches.lock(pipeline_id)
            if not lock.acquire(wait=False):
                continue  # its launcher is alive (perhaps paused) and may still start the job
            try:
                del self._unresolved[pipeline_id]
                if not self.launches.spawn_was_attempted(pipeline_id, record.token):
                    self.compute.release(pipeline_id)
                    self._fail(pipeline_id, "the job never started (its scheduler stopped while launching it)", touched=False, now=now)
                    continue
                launch = self._launch(info, Placement.from_record(info.placement), info.started_at or now, record.token)
                alive = self.executor.attach(launch)
                process = self.executor.process(pipeline_id)
                if alive and process is not None:
                    self.ledger.record_started(pipeline_id, record.token, *process, now=now)
                self.log(
                    f"pipeline {pipeline_id} was being launched before the restart: "
                    + ("adopted its running job" if alive else "its job ended")
                )
            finally:
                lock.release()

    # -- the tick ---------------------------------------------------------------------------

    def tick(self, now: float) -> TickReport:
        """One scheduling cycle at clock ``now`` (docs/design.md §4.3): read the ledger's
        changes (:class:`~privsched.service.pending.PendingSet`), unlock, expire timed-out
        pipelines, end those that can never be granted, admit (the policy orders each
        dataset's pending pipelines; the ledger commits the grants in one transaction),
        place granted jobs on free compute, collect ended jobs and settle them. Returns
        what it did and what is left (:class:`TickReport`)."""
        report = TickReport()
        self.resolve_launches(now)
        if self._reread:
            self.pending.rebuild()
            self._reread = False
        self._refresh()
        unlocked, report.more_to_unlock = self.unlock(now)
        report.unlocked = len(unlocked)
        report.expired = self.ledger.expire(now=now) if self.pending.next_deadline() <= now else []
        if report.expired:
            self.log(f"timed out waiting for budget: pipelines {', '.join(map(str, report.expired))}")
        if unlocked or report.expired:
            self._refresh()
        report.expired += self.end_never_grantable(now)
        report.granted, report.reserved_changed = self.admit(now)
        if report.granted:  # before placing (a job launch takes a while): waiting requests see the grant now
            wakeup.changed(self.ledger.path, report.granted)
        report.pending = self.pending.count
        report.started, report.waiting = self.place(now)
        report.settled = self.collect(now)
        if report.settled:
            self.retire_exhausted(now)
        report.running = len(self.executor.running()) + len(self._unresolved) + len(self._unsettled)
        return report

    def news(self) -> bool:
        """Whether pipelines arrived, or blocks gained unlocked budget, that no allocation
        pass has looked at yet (reading the ledger's changes now)."""
        self._refresh()
        marks = self._unadmitted
        return bool(marks.arrived or marks.gained)

    def _refresh(self) -> None:
        """Read the ledger's changes into :attr:`pending`, and note them for the next checks."""
        marks = self.pending.refresh()
        for pending in (self._unchecked, self._unadmitted, self._unretired):
            pending.add(marks)

    def _changed(self, dataset_id: int, marks: Marks, blocks: set[int]) -> np.ndarray | None:
        """Ids of the dataset's pending pipelines that arrived or ask for one of ``blocks``
        since ``marks`` were taken; None: all of them (after a full read)."""
        if marks.everything:
            return None
        return np.union1d(self.pending.among(dataset_id, marks.arrived), self.pending.touching(dataset_id, blocks))

    def end_never_grantable(self, now: float) -> list[int]:
        """Fail the pending pipelines that no future unlock can satisfy, with the reason
        (nothing was allocated to them); returns their ids. Only pipelines that arrived, or
        whose blocks lost unconsumed budget, since the last check are looked at: for the
        others nothing changed."""
        marks = self._unchecked.take()
        ended = []
        try:
            for dataset_id, table in self.pending.tables.items():
                pipelines = self._changed(dataset_id, marks, marks.worsened)
                if not len(table.pipeline_ids) or (pipelines is not None and not len(pipelines)):
                    continue
                for pipeline_id, reason in never_grantable(self.pending.view(dataset_id, pipelines), self.pending.blocks).items():
                    try:
                        self._fail(pipeline_id, reason, touched=False, now=now)
                    except LedgerError as exc:  # cancelled since it was read
                        self.log(f"pipeline {pipeline_id}: {exc}")
                        continue
                    ended.append(pipeline_id)
        except BaseException:
            self._unchecked.add(marks)
            raise
        if ended:
            self._refresh()
        return ended

    def awaits_timeouts(self) -> bool:
        """Whether some pending pipeline will still time out: time alone will change its state."""
        return self.pending.next_deadline() < np.inf

    def retire_exhausted(self, now: float) -> None:
        """Retire the blocks consumed up to capacity (the ledger checks every active block),
        if a block whose consumption grew since the last look may have reached it."""
        self._refresh()
        marks = self._unretired.take()
        blocks = (
            self.pending.blocks.values()
            if marks.everything
            else (self.pending.blocks[b] for b in marks.worsened if b in self.pending.blocks)
        )
        accounting = {d.name: d.accounting for d in self.pending.datasets.values()}
        for block in blocks:
            live = accounting[block.dataset].live(block.capacity)
            if block.state == "active" and np.all(leq(block.capacity, block.consumed) | ~live):
                self.ledger.retire_exhausted(now=now)
                return

    def unlock(self, now: float) -> tuple[list[int], bool]:
        """Raise each active block's unlocked fraction to the rule's target with the same
        functions as the simulator (:func:`~privsched.policies.unlock.unlocked_fraction`,
        :func:`~privsched.policies.unlock.unlock_amounts`; module docstring). Per-time rules count
        the clock up to the last instant of ``unlock_grid`` (all of it without a grid).
        Returns the ids of the blocks unlocked, and whether time will unlock more."""
        rule = self.policy.unlock
        counted = self.unlock_grid.floor(now) if self.unlock_grid is not None else now
        targets: dict[int, float] = {}
        more = False
        for dataset in sorted(self.pending.datasets.values(), key=lambda d: d.name):
            blocks = self.pending.blocks_of(dataset)
            active = np.flatnonzero(blocks.active)
            if not active.size:
                continue
            ids = blocks.ids[active]
            arrivals = np.fromiter((self.pending.arrivals[i] for i in ids.tolist()), dtype=float, count=len(ids))
            target = unlocked_fraction(rule, arrivals, counted - blocks.created_at[active])
            moved = unlock_amounts(blocks.capacity[active], blocks.locked[active], target)
            targets.update((int(ids[i]), float(target[i])) for i in np.flatnonzero((moved > 0).any(axis=1)).tolist())
            more = more or bool(rule.on_tick(1.0) > 0 and np.any(target < 1.0))
        if targets:
            self.ledger.raise_unlocked(targets, now=now)
        return list(targets), more

    def admit(self, now: float) -> tuple[list[int], bool]:
        """Order and admit each dataset's pending pipelines with the policy, then commit all
        the grants of the pass in one ledger transaction, each elastic pipeline at the
        fraction of its demand the policy chose (``Allocation.fraction``).

        A policy that orders pipelines one by one and admits best-effort
        (:class:`~privsched.policies.base.PerPipelineOrder`) is shown only the pipelines
        that arrived, or whose blocks gained unlocked budget, since its last pass: after a
        pass that the ledger committed as chosen, no pending pipeline fits (the budget only
        shrinks within a pass), and a fit only depends on the pipeline's own blocks, so the
        others cannot fit now either, and the pass over the shown pipelines grants what a
        pass over all of them would. Under team quotas the policy sees every pending
        pipeline of the dataset, and its team's quota and holdings, so that it skips what a
        quota holds back and goes on to the next (:class:`~privsched.policies.base.Quotas`).
        A grant the ledger refused (a change from another process) makes the scheduler read
        everything again and show everyone."""
        marks = self._unadmitted.take()
        order: list[int] = []
        fractions: dict[int, float] = {}
        reserved: dict[tuple[int, int], np.ndarray] = {}
        every = marks.everything or not orders_per_pipeline(self.policy.policy)
        try:
            for dataset_id, table in sorted(self.pending.tables.items(), key=lambda item: self.pending.datasets[item[0]].name):
                teams = self.ledger.team_quotas(dataset_id, table.pipeline_ids.tolist()) if len(table.pipeline_ids) else None
                # Under quotas a pipeline's fit also depends on what its team holds: show all.
                pipelines = None if every or teams is not None else self._changed(dataset_id, marks, marks.gained)
                if not len(table.pipeline_ids) or (pipelines is not None and not len(pipelines)):
                    continue
                view = self.pending.view(dataset_id, pipelines)
                snapshot = snapshot_of(view, now, edge_reservations(view, self._reserved), teams)
                allocation = self.policy.policy.allocate(snapshot)
                granted = [int(i) for i in view.pipelines.pipeline_ids[allocation.granted]]
                if allocation.reserved is not None:
                    reserved.update(_waiting_reservations(edge_keys(view), allocation.reserved, set(granted)))
                order.extend(granted)
                fractions.update((i, float(f)) for i, f in zip(granted, allocation.fractions()) if f < 1.0)
            granted = self.ledger.grant(order, now=now, fractions=fractions or None) if order else []
        except BaseException:
            self._unadmitted.add(marks)
            raise
        changed = reserved.keys() != self._reserved.keys() or any(
            not np.array_equal(amount, self._reserved[key]) for key, amount in reserved.items()
        )
        self._reserved = reserved  # pipelines no longer pending drop theirs
        if changed:
            self.runs.record_reservations(reserved)  # for the waiting reasons of every client
        self._reread = granted != order  # a change the pass did not see: read everything next tick
        if order:
            self._refresh()
        if granted:
            self.log(f"granted pipelines {', '.join(map(str, granted))}")
        return granted, changed

    def place(self, now: float) -> tuple[list[int], int]:
        """Start granted jobs on free compute in grant order, letting smaller jobs behind a
        job that does not fit yet go first (backfilling). Stops after a start when new
        pipelines have arrived (:meth:`news`): their pass comes first, the rest are placed by
        the next tick. Returns started ids and how many still wait."""
        waiting = sorted(self.ledger.list_pipelines(states=["granted"]), key=lambda p: (p.granted_at or 0, p.id))
        started = []
        for info in waiting:
            try:
                need = Resources.model_validate(info.resources)
            except ValidationError as exc:  # recorded by another client of the ledger
                self._fail(info.id, f"invalid resources: {validation_message(exc)}", touched=False, now=now)
                continue
            refusal = self.compute.pool.refusal(need)
            if refusal is not None:
                self._fail(info.id, f"cannot run on this scheduler's pool: {refusal}", touched=False, now=now)
                continue
            problem = input_problem(info.job, self._block_locations(info), self.runs.workdir(info.id)) or self._data_problem(info)
            if problem is not None:
                self._fail(info.id, f"the job cannot read its data: {problem}", touched=False, now=now)
                continue
            placement = self.compute.place(info.id, need)
            if placement is not None and self._start(info, placement, now):
                started.append(info.id)
                if self.news():
                    break
        return started, len(waiting) - len(started)

    def _start(self, info: PipelineInfo, placement: Placement, now: float) -> bool:
        """Launch a granted job in the recoverable steps of :mod:`~privsched.service.launching`."""
        token = secrets.token_hex(16)
        try:
            launch = self._launch(info, placement, now, token)
        except OSError:  # its run folder cannot be written (a full or read-only disk): retried next tick
            self.compute.release(info.id)
            raise
        with self.launches.lock(info.id):
            try:
                self.ledger.mark_running(info.id, self._placement_record(placement), now=now, launch_token=token)
            except LedgerError as exc:  # cancelled since it was listed
                self.compute.release(info.id)
                self.log(f"pipeline {info.id} not started: {exc}")
                return False
            try:
                self.launches.mark_spawning(info.id, token)
                self.executor.start(launch)
            except OSError as exc:  # no process was started
                self.launches.clear_spawn_marker(info.id)
                try:
                    self._fail(info.id, f"the job could not be started: {exc}", touched=False, now=now)
                except StorageFull:  # released once space returns (resolve_launches)
                    self._unresolved[info.id] = (info, LaunchRecord(info.id, token, None, "launching", None, None, now))
                    raise
                self.compute.release(info.id)
                return False
            process = self.executor.process(info.id) or (None, None)
            self.ledger.record_started(info.id, token, *process, now=now)
        self.log(f"started pipeline {info.id} ({info.name}) on GPUs [{','.join(placement.gpus)}]")
        return True

    def _placement_record(self, placement: Placement) -> dict:
        record = {"executor": self.executor.name, "host": socket.gethostname(), **placement.to_dict()}
        return {**record, "sandbox": self.executor.sandbox}

    def _launch(self, info: PipelineInfo, placement: Placement, started_at: float, token: str | None) -> Launch:
        """Write the job's context file and describe its launch."""
        folder = self.runs.folder(info.id, create=True)
        context = self._context(info, placement)
        document = {**context.to_dict(), "job": info.job, "protected": self._protected(info)}
        write_atomic(folder / "context.json", json.dumps(document))
        return Launch(
            pipeline_id=info.id,
            context=self.runs.context(info.id),
            result=self.runs.result(info.id),
            log=self.runs.log(info.id),
            placement=placement,
            started_at=started_at,
            max_runtime=info.job.get("max_runtime"),
            token=token,
        )

    def _protected(self, info: PipelineInfo) -> list[str]:
        """What the job's sandbox must not expose: the ledger, every run, other blocks' data."""
        granted = {(info.dataset, key) for key in info.block_keys}
        self._refresh()  # every block recorded so far, read incrementally
        others = [b.location for b in self.pending.blocks.values() if b.location and (b.dataset, b.key) not in granted]
        return self.runs.protected() + others

    def _block_locations(self, info: PipelineInfo) -> dict[str, str | None]:
        """The data location of each block the pipeline was granted."""
        locations = self._locations.get(info.dataset, {})
        if any(key not in locations for key in info.block_keys):
            locations = {b.key: b.location for b in self.ledger.list_blocks(info.dataset)}
            self._locations[info.dataset] = locations
        return {key: locations[key] for key in info.block_keys}

    def _data_problem(self, info: PipelineInfo) -> str | None:
        """A granted block whose data is missing or changed since it was registered (its
        fingerprint, :mod:`privsched.ledger.fingerprints`), or None."""
        fingerprints = self._fingerprints.get(info.dataset, {})
        if any(key not in fingerprints for key in info.block_keys):
            fingerprints = self._refresh_fingerprints(info.dataset)
        locations = self._block_locations(info)
        for key in info.block_keys:
            problem = data_problem(locations[key], fingerprints[key])
            if problem is not None:  # a user block may have grown since: its registered fingerprint decides
                problem = data_problem(locations[key], self._refresh_fingerprints(info.dataset)[key])
            if problem is not None:
                return f"block {key!r}: {problem}"
        return None

    def _refresh_fingerprints(self, dataset: str) -> dict[str, str | None]:
        fingerprints = {b.key: b.sha256 for b in self.ledger.list_blocks(dataset)}
        self._fingerprints[dataset] = fingerprints
        return fingerprints

    def _context(self, info: PipelineInfo, placement: Placement) -> JobContext:
        """What the granted job sees: its blocks and grant (the fraction of its demand an
        elastic grant gave), the mechanism the ledger charged (typed, as ``plan``), the (ε, δ)
        and longest run it was submitted with (an elastic range: a built-in job gets its min
        too and calibrates itself; a code job gets the largest ε its grant holds,
        :func:`~privsched.budgets.elastic.granted_epsilon`), and its own
        parameters (a built-in job's with its kind), untouched."""
        dataset = self.ledger.get_dataset(info.dataset)
        locations = self._block_locations(info)
        job = info.job
        params = dict(job.get("params") or {})
        if job.get("kind"):
            params = {"kind": job["kind"], **params}
        grants = info.granted
        epsilon = job.get("epsilon")
        if job.get("kind") is None and job.get("epsilon_min") is not None and epsilon is not None:
            budget = np.min(np.stack(list(grants.values())), axis=0)
            epsilon = granted_epsilon(budget, job["epsilon_min"], epsilon, job.get("delta") or 0.0, dataset.accounting)
        return JobContext(
            pipeline_id=info.id,
            name=info.name,
            dataset=info.dataset,
            accounting=dataset.accounting,
            delta=job.get("delta") or dataset.delta,
            blocks={k: BlockGrant(k, locations[k], grant) for k, grant in grants.items()},
            device="cuda" if placement.gpus else "cpu",
            workers=Resources.model_validate(info.resources).processes if job.get("kind") == "dpsgd" else 1,
            workdir=self.runs.workdir(info.id),
            params=params,
            plan=None if info.mechanism is None else parse_mechanism(info.mechanism),
            epsilon=epsilon,
            epsilon_min=None if job.get("kind") is None else job.get("epsilon_min"),
            max_runtime=job.get("max_runtime"),
            unit=dataset.unit,
            user_column=dataset.user_column,
            max_rows_per_user=dataset.max_rows_per_user,
        )

    def collect(self, now: float) -> list[int]:
        """Stop jobs whose users asked to cancel them, then settle every job that ended."""
        for pipeline_id in self.executor.running():
            if self.runs.cancel_request(pipeline_id).exists():
                self.executor.cancel(pipeline_id, "cancelled by its user while running")
        for result in self.executor.poll(now):
            self.compute.release(result.pipeline_id)
            self._unsettled[result.pipeline_id] = result
        settled = self._settle_together(now) if len(self._unsettled) > 1 else []
        for pipeline_id, result in list(self._unsettled.items()):
            if self._settle(result, now):  # raises StorageFull, keeping this and later results for a retry
                settled.append(pipeline_id)
            del self._unsettled[pipeline_id]
        return settled

    def _settle_together(self, now: float) -> list[int]:
        """Settle every ended job in one ledger transaction (one disk sync for all); their
        ids, or none when the ledger refused one of them (each is then settled alone, with
        its own outcome). Raises StorageFull, keeping every result for a retry."""
        results = list(self._unsettled.values())
        states = settle_together(self.ledger, results, now, [self._canceller(result) for result in results])
        if states is None:
            return []
        for result, state in zip(results, states):
            self._log_settled(result, state)
            del self._unsettled[result.pipeline_id]
        return [result.pipeline_id for result in results]

    def _settle(self, result: JobResult, now: float) -> bool:
        try:
            state = settle(self.ledger, result, now, actor=self._canceller(result))
        except StorageFull:
            raise
        except LedgerError as exc:  # already settled (e.g. by an earlier scheduler)
            self.log(f"pipeline {result.pipeline_id}: {exc}")
            return False
        self._log_settled(result, state)
        return True

    def _log_settled(self, result: JobResult, state: str) -> None:
        detail = f": {result.message}" if result.message and state == "failed" else ""
        self.log(f"pipeline {result.pipeline_id} {state}{detail}")

    def _canceller(self, result: JobResult) -> str | None:
        """Who the failure of a job that a user asked to cancel is recorded as caused by: the
        last requester of its cancellation (the ledger's ``stop`` events), None (the scheduler)
        for a job that completed, or failed with no cancellation asked."""
        if result.completed or not self.runs.cancel_request(result.pipeline_id).exists():
            return None
        stops = [e.actor for e in self.ledger.events(pipeline_id=result.pipeline_id) if e.kind == "stop"]
        return stops[-1] if stops else None

    def _fail(self, pipeline_id: int, message: str, *, touched: bool, now: float) -> None:
        self.ledger.fail(pipeline_id, message, touched_data=touched, now=now)
        self.log(f"pipeline {pipeline_id} failed: {message}")
        wakeup.changed(self.ledger.path, [pipeline_id])  # whichever phase failed it: requests waiting on it look again


def _waiting_reservations(keys: list[tuple[int, int]], reserved: np.ndarray, granted: set[int]) -> dict[tuple[int, int], np.ndarray]:
    """Round robin's reservations per (pipeline id, block id) of the pipelines still waiting
    (a granted pipeline's reservation becomes its allocation)."""
    return {key: np.array(amount, dtype=float) for key, amount in zip(keys, reserved) if key[0] not in granted and np.any(amount != 0)}
