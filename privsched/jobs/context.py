"""What a granted job sees: its granted blocks (and no others), its grant, the mechanism it
was charged, its device.

A :class:`JobContext` travels to the job's supervisor (local or on a cluster) as JSON; the
job's own copy holds its blocks' keys and grants but not their locations: it reads data only
through :meth:`JobContext.open_block` (or :meth:`JobContext.block_files`), which its
supervisor answers with open, read-only descriptors (:mod:`privsched.jobs.primitives`), and it
reports what it actually spent with :meth:`JobContext.report_spent`. The executor turns the context's final state into a
:class:`JobResult` that the scheduler settles in the ledger (docs/design.md §4.4).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from privsched.budgets.accounting import Accounting, leq
from privsched.budgets.mechanisms import Mechanism, mechanism_json, parse_mechanism
from privsched.errors import Forbidden
from privsched.jobs.contribution import Contribution


#: The training behind :meth:`JobContext.dp_sgd`, loaded by its import path like a built-in
#: job (it lives with the trainers, above this package).
DP_SGD = "privsched.trainers.code_training:dp_sgd"


class BlockAccessError(Forbidden):
    """A job asked for a block outside its grant."""


@dataclass
class BlockGrant:
    key: str
    location: str | None  # where the supervisor finds the block's data (None in the job's own context)
    grant: np.ndarray  # (K,) budget granted on this block


def block_file_paths(location: str) -> dict[str, Path]:
    """The files of a block, by name within it: a block that is one file is ``{"": file}``; a
    folder is each regular file below it, by its relative path (``/``-separated), in order.
    A missing location raises ``FileNotFoundError``."""
    root = Path(location)
    if not root.is_dir():
        if not root.exists():
            raise FileNotFoundError("the block's data is missing")
        return {"": root}
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                files[path.relative_to(root).as_posix()] = path
    return files


@dataclass
class JobContext:
    """Everything a job may read and call (docs/design.md §6.2).

    A job reads its pipeline's identity, its granted blocks' data through :meth:`open_block`
    or :meth:`block_files` (any other block raises :class:`BlockAccessError`), its grant
    (:attr:`budget`), the mechanism the ledger charged (:attr:`plan`) and the (ε, δ) it was
    planned with, its longest run, its device, its working folder and its parameters; it calls
    :meth:`report_spent` with what it actually spent (at most its grant) and
    :meth:`report_metrics` with what it computed. Nothing else reaches the ledger.
    """

    pipeline_id: int  # the pipeline's ledger id
    name: str  # the pipeline's name
    dataset: str  # the dataset's name
    accounting: Accounting  # how budgets are counted (basic or RDP orders)
    delta: float  # the δ the pipeline was planned with, else the dataset's δ_G: reports (ε, δ) of an RDP curve
    blocks: dict[str, BlockGrant]  # the granted blocks: key -> grant (and location, the supervisor's copy only)
    device: str = "cpu"  # "cuda" when the job was placed on a GPU
    workers: int = 1  # data-parallel DP-SGD processes (one per GPU, or CPU workers)
    rank: int = 0  # this process's rank among ``workers`` when they run across nodes
    #: Where ranks across nodes meet (privsched's choice): ``{"address", "port", "interface"}``
    #: of the first rank's node; None when one process forks all of them (one host).
    rendezvous: dict[str, Any] | None = None
    workdir: Path = field(default_factory=lambda: Path("."))  # the job's own writable work folder
    params: dict[str, Any] = field(default_factory=dict)  # the job's parameters (a built-in job's: its kind too)
    plan: Mechanism | None = None  # the mechanism the ledger charged (its demand is this curve or more)
    epsilon: float | None = None  # the ε the pipeline was planned with (None: it declared a mechanism)
    epsilon_min: float | None = None  # the least ε of an elastic range (None: a fixed ε)
    max_runtime: float | None = None  # seconds the job may run before it is stopped (None: no limit)
    unit: str = "record"  # the dataset's unit of privacy (docs/privacy.md "Units")
    user_column: str | None = None  # the column naming the person (user units)
    max_rows_per_user: int = 1  # K: rows of one person any read of a block returns (user units)
    spent: np.ndarray | None = None  # set by report_spent
    metrics: dict[str, Any] = field(default_factory=dict)  # set by report_metrics
    touched_data: bool = False  # set once the job asked for a block's data
    #: The supervisor's channel (privacy primitives, brokered block reads); None outside one.
    channel: Any = field(default=None, repr=False, compare=False)

    @property
    def block_keys(self) -> list[str]:
        return list(self.blocks)

    @property
    def budget(self) -> np.ndarray:
        """The budget the job may spend on *every* block it reads: the element-wise minimum
        of its per-block grants (a job's data touches all its blocks, so each is charged)."""
        return np.min(np.stack([b.grant for b in self.blocks.values()]), axis=0)

    @property
    def contribution(self) -> Contribution | None:
        """The bound every read of a block applies: K rows per person (None for records)."""
        if self.unit == "record" or self.user_column is None:
            return None
        return Contribution(self.user_column, self.max_rows_per_user)

    def open_block(self, key: str) -> BinaryIO:
        """A granted block's data, open for reading (``numpy.load`` and
        ``pyarrow.parquet.read_table`` take it); a block of several files raises ``ValueError``
        (read it with :meth:`block_files`), any other block :class:`BlockAccessError`."""
        files = self.block_files(key)
        if list(files) != [""]:
            for stream in files.values():
                stream.close()
            raise ValueError(f"block {key!r} holds {len(files)} files: read them with block_files")
        return files[""]

    def block_files(self, key: str) -> dict[str, BinaryIO]:
        """A granted block's files, open for reading, by name within the block (``""`` for a
        block that is one file). Under a supervisor the files come as descriptors it opened,
        read-only, and the job is charged as having read its data from then on; called
        in-process (no supervisor), the files are opened here."""
        if key not in self.blocks:
            raise BlockAccessError(f"pipeline {self.pipeline_id} was not granted block {key!r}")
        self.touched_data = True
        if self.channel is not None:
            return self.channel.open_block(key)
        location = self.blocks[key].location
        if location is None:
            raise BlockAccessError(f"block {key!r} has no data location")
        return {name: path.open("rb") for name, path in block_file_paths(location).items()}

    def read(self, columns: Sequence[str] | None = None, as_: str = "arrow", keys: Iterable[str] | None = None) -> Any:
        """The records of the granted blocks (``keys``: only these), every column or only
        ``columns``, as an Arrow table (``as_="arrow"``), NumPy arrays by column name
        (``"numpy"``) or a pandas DataFrame (``"pandas"``). Each block is opened through
        :meth:`open_block`, the one gate to block data."""
        from privsched.jobs.records import block_source, read_table, table_as

        wanted = list(self.block_keys if keys is None else keys)
        for key in wanted:
            if key not in self.blocks:
                self.open_block(key)  # raises before any block is opened
        opened = [self.block_files(key) for key in wanted]
        try:
            return table_as(read_table([block_source(files) for files in opened], columns, self.contribution), as_)
        finally:
            for files in opened:
                for stream in files.values():
                    stream.close()

    def _primitive(self, query: str, epsilon: float, delta: float, **request: Any) -> Any:
        """A DP release computed and charged by the supervisor (:mod:`privsched.jobs.primitives`)."""
        if self.channel is None:
            raise RuntimeError("privacy primitives are available only to a job run by privsched's runner")
        return self.channel.call({"op": query, "epsilon": epsilon, "delta": delta, **request})

    def dp_count(self, epsilon: float, delta: float = 0.0, noise: str = "laplace") -> float:
        """The number of records of the granted blocks, with ``noise`` (laplace or gaussian) for (ε, δ)."""
        return self._primitive("count", epsilon, delta, noise=noise)

    def dp_sum(self, column: str, bounds: tuple[float, float], epsilon: float, delta: float = 0.0, noise: str = "laplace") -> float:
        """The sum of ``column`` clipped to ``bounds``, with noise for (ε, δ)."""
        return self._primitive("sum", epsilon, delta, column=column, bounds=list(bounds), noise=noise)

    def dp_mean(self, column: str, bounds: tuple[float, float], epsilon: float, delta: float = 0.0, noise: str = "laplace") -> float:
        """A noisy sum over a noisy count, each with half of (ε, δ), clipped to ``bounds``."""
        return self._primitive("mean", epsilon, delta, column=column, bounds=list(bounds), noise=noise)

    def dp_histogram(
        self, column: str, bounds: tuple[float, float], bins: int, epsilon: float, delta: float = 0.0, noise: str = "laplace"
    ) -> dict:
        """Noisy counts of ``column`` in ``bins`` equal bins over ``bounds`` (``value``, ``edges``)."""
        return self._primitive("histogram", epsilon, delta, column=column, bounds=list(bounds), bins=bins, noise=noise)

    def dp_sgd(self, model: Any, features: list[str] | None = None, label: str | None = None, **training: Any) -> Any:
        """Train ``model`` (a torch module) with DP-SGD on the granted blocks' ``features``
        and ``label`` (or ``data=``, a dataset of (input, label) pairs) and return it, saved
        as the pipeline's ``model.pt``. The supervisor plans and charges the training first
        (q, σ, steps from ``epsilon``, default the whole grant: :mod:`privsched.budgets.training_plan`);
        the job then trains with that plan. Keywords: :func:`privsched.trainers.code_training.dp_sgd`."""
        if self.channel is None:
            raise RuntimeError("privacy primitives are available only to a job run by privsched's runner")
        module, _, name = DP_SGD.partition(":")
        return getattr(importlib.import_module(module), name)(self, model, features, label, **training)

    def report_spent(self, spent: np.ndarray | list[float]) -> None:
        """Record the budget actually spent on each granted block.

        It must be at most the grant in every dimension (every order under RDP): a job that
        runs its granted plan, or less of it, always is (docs/design.md §4.4)."""
        vector = np.asarray(spent, dtype=float)
        if vector.shape != (self.accounting.dims,) or not np.all(np.isfinite(vector)) or np.any(vector < 0):
            raise ValueError(f"spent budget must be {self.accounting.dims} finite non-negative values")
        if not np.all(leq(vector, self.budget)):
            raise ValueError("spent budget exceeds the grant at some order")
        self.spent = vector

    def report_metrics(self, **metrics: Any) -> None:
        self.metrics.update(metrics)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The context as JSON values (:meth:`from_json` reads them back)."""
        return {
            "pipeline_id": self.pipeline_id,
            "name": self.name,
            "dataset": self.dataset,
            "accounting": self.accounting.to_dict(),
            "delta": self.delta,
            "blocks": [{"key": b.key, "location": b.location, "grant": b.grant.tolist()} for b in self.blocks.values()],
            "device": self.device,
            "workers": self.workers,
            "rank": self.rank,
            "rendezvous": self.rendezvous,
            "workdir": str(self.workdir),
            "params": self.params,
            "plan": None if self.plan is None else json.loads(mechanism_json(self.plan)),
            "epsilon": self.epsilon,
            "epsilon_min": self.epsilon_min,
            "max_runtime": self.max_runtime,
            "unit": self.unit,
            "user_column": self.user_column,
            "max_rows_per_user": self.max_rows_per_user,
        }

    @classmethod
    def from_json(cls, text: str) -> JobContext:
        data = json.loads(text)
        return cls(
            pipeline_id=data["pipeline_id"],
            name=data["name"],
            dataset=data["dataset"],
            accounting=Accounting.from_dict(data["accounting"]),
            delta=data["delta"],
            blocks={b["key"]: BlockGrant(b["key"], b["location"], np.asarray(b["grant"], dtype=float)) for b in data["blocks"]},
            device=data["device"],
            workers=int(data.get("workers", 1)),
            rank=int(data.get("rank", 0)),
            rendezvous=data.get("rendezvous"),
            workdir=Path(data["workdir"]),
            params=data["params"],
            plan=None if data.get("plan") is None else parse_mechanism(data["plan"]),
            epsilon=data.get("epsilon"),
            epsilon_min=data.get("epsilon_min"),
            max_runtime=data.get("max_runtime"),
            unit=data.get("unit", "record"),
            user_column=data.get("user_column"),
            max_rows_per_user=data.get("max_rows_per_user", 1),
        )
