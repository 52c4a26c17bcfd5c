"""The ledger's data classes take budget vectors as the stored BLOBs and decode them on
first read: the same floats, bit for bit, one array per field, whoever reads it first."""

from __future__ import annotations

import pickle
import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from privsched.ledger.models import BlockInfo, Event, PipelineInfo
from privsched.ledger.schema import pack
from privsched.ledger.states import PipelineState

vectors = arrays(np.float64, st.integers(1, 14), elements=st.floats(allow_nan=False, width=64))


def block(*balances: object) -> BlockInfo:
    return BlockInfo(1, "d", "k", None, "active", 0.0, *balances)


@given(st.lists(vectors, min_size=5, max_size=5))
def test_a_stored_vector_reads_back_bit_for_bit(balances):
    info = block(*(pack(v) for v in balances))
    for name, given_vector in zip(("capacity", "locked", "unlocked", "allocated", "consumed"), balances):
        read = getattr(info, name)
        assert read.dtype == np.float64 and read.tobytes() == given_vector.tobytes()
        assert getattr(info, name) is read  # decoded once, then kept


def test_an_array_given_is_kept_as_given_and_none_stays_none():
    capacity = np.array([1.0, 1e-6])
    info = block(capacity, capacity, capacity, capacity, capacity)
    assert info.capacity is capacity
    event = Event(1, 0.0, "create", 1, None, None, None, "created", None, None)
    assert event.amount is None


def test_demands_by_block_decode_and_a_pipeline_without_consumption_reads_none():
    demand = np.array([0.5, 0.25])
    info = PipelineInfo(
        1,
        "p",
        "d",
        PipelineState.PENDING,
        "o",
        1.0,
        None,
        0.0,
        None,
        None,
        None,
        ["a"],
        {"a": pack(demand)},
        None,
        {},
        {},
        None,
        None,
        None,
    )
    assert info.demands["a"].tolist() == [0.5, 0.25] and info.consumed is None


def test_threads_reading_a_vector_first_at_once_all_get_the_one_kept_array():
    info = block(*(pack(np.arange(3.0)) for _ in range(5)))
    start = threading.Barrier(8)
    seen: list[int] = []

    def read() -> None:
        start.wait()
        seen.append(id(info.capacity))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and len(set(seen)) == 1 and seen[0] == id(info.capacity)


def test_a_record_pickles_before_and_after_its_vectors_are_read():
    info = block(*(pack(np.array([float(i), 2.0])) for i in range(5)))
    unread = pickle.loads(pickle.dumps(info))
    assert unread.locked.tolist() == [1.0, 2.0]
    info.consumed  # noqa: B018  (decode one field)
    read = pickle.loads(pickle.dumps(info))
    assert read.consumed.tolist() == [4.0, 2.0] and read.capacity.tolist() == [0.0, 2.0]
