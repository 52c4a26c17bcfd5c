"""The audit tells rounding from over-spending: grants that fill a bucket and releases that
empty it in another order leave ±ulps of the amounts that passed through it, which is no
violation, while a real over-spend stays one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.ledger import Ledger, PipelineRequest

DEMANDS = st.lists(st.floats(1e-3, 3.0, allow_nan=False), min_size=2, max_size=12)


@settings(max_examples=25, deadline=None)
@given(scales=DEMANDS, order=st.randoms(use_true_random=False))
def test_grants_released_in_any_order_leave_a_clean_audit(tmp_path_factory, scales, order):
    path = tmp_path_factory.mktemp("rounding") / "ledger.db"
    with Ledger.init(path) as ledger:
        ledger.create_dataset("reviews", 10.0, 1e-7, now=0)
        (block,) = ledger.add_blocks("reviews", ["r1"], unlocked_fraction=1.0, now=0)
        alphas = np.array(ledger.get_dataset("reviews").accounting.alphas)
        # Gaussian-shaped curves α·s/50: positive at the dead low orders too, where the
        # unlocked budget goes negative and allocated sums terms of different sizes.
        ids = [ledger.submit(PipelineRequest(f"p{i}", "reviews", ["r1"], demand=alphas * s / 50), now=1) for i, s in enumerate(scales)]
        granted = ledger.grant(ids, now=2)
        order.shuffle(granted)
        for pipeline_id in granted:
            ledger.fail(pipeline_id, "not started", touched_data=False, now=3)
        report = ledger.audit()
        assert report.ok, report.violations
        allocated = ledger.get_block("reviews", "r1").allocated
        np.testing.assert_allclose(allocated, 0.0, atol=1e-9)


def test_an_over_spend_far_beyond_rounding_is_still_reported(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger.init(path) as ledger:
        ledger.create_dataset("reviews", 10.0, 1e-7, now=0)
        (block,) = ledger.add_blocks("reviews", ["r1"], unlocked_fraction=1.0, now=0)
        ledger.db.execute("UPDATE balances SET allocated = ? WHERE block_id = ?", [np.full(block.capacity.size, -1e-6).tobytes(), block.id])
        ledger.db.conn.commit()
        report = ledger.audit()
    assert not report.ok and any("negative allocated" in v for v in report.violations)
