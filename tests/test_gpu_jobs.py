"""A DP-SGD pipeline placed on a GPU trains there, confined like any job. Needs a CUDA GPU
(skipped, with the reason, everywhere else: nothing in privsched requires one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from privsched import connect
from privsched.service.rundirs import RunDirs
from workloads.reviews import write_blocks

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def test_a_dpsgd_pipeline_placed_on_a_gpu_trains_there(tmp_path: Path):
    paths = write_blocks(tmp_path / "data", days=2, per_day=400, seed=0)
    with connect(tmp_path / "p.db") as client:
        client.create_dataset("reviews", epsilon=10.0, delta=1e-7, accounting="rdp")
        client.add_blocks("reviews", [(path.stem, str(path)) for path in paths])
        run = client.submit(
            {
                "name": "on-gpu",
                "dataset": "reviews",
                "blocks": {"last": 2},
                "epsilon": 1.0,
                "delta": 1e-9,
                "resources": {"gpus": 1, "cpus": 1},
                "job": {"kind": "dpsgd", "params": {"model": "mlp", "sample_rate": 0.1, "epochs": 1, "lr": 0.05}},
            }
        )
        client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=torch.cuda.device_count())
        info = client.status(run.id)
        assert info.state == "completed", info.message
        assert len(info.placement["gpus"]) == 1
        weights = torch.load(RunDirs(client.path).workdir(run.id) / "model.pt", weights_only=True)
        assert run.metrics["device"] == "cuda"  # trained there
        assert weights and not any(tensor.is_cuda for tensor in weights.values())  # saved to load anywhere
