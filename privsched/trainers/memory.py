"""The memory a built-in DP-SGD job's training needs, estimated at submit from the job alone.

For a model of P float32 parameters trained on W processes (each holds a whole copy):

    bytes = 4 · P · (2 + S + N + G) · W

- 2: the weights and their gradient (the clipped sum, which single-pass ghost clipping hands
  to the optimizer without a copy);
- S: the optimizer's state per parameter, 2 for Adam (its first and second moments,
  Kingma & Ba 2015, Algorithm 1), 0 for plain SGD;
- N = 5: the secure noise's buffers, four normal draws per coordinate and their sum
  (:mod:`privsched.trainers.secure_noise`; Holohan & Braghin 2021 §5.1);
- G: per-sample gradient needs: B (the expected batch size) under ``hooks``, where Opacus
  keeps one gradient per example of the batch (Yousefpour et al. 2021, §3), 1 under ghost
  clipping, which keeps per-example norms only (Bu et al. 2023).

It leaves out activations and the data (a lower bound of what the job needs): a job whose
``resources.memory`` is below it cannot train and is refused in one line. Imports torch:
import it lazily.
"""

from __future__ import annotations

from privsched.trainers.dpsgd import default_mode, initial_model, shape_only
from privsched.trainers.plans import DPSGDJob
from privsched.trainers.secure_noise import SECURE_DRAWS

#: Bytes of one float32 parameter.
PARAMETER_BYTES = 4
#: State the optimizer keeps per parameter.
OPTIMIZER_STATES = {"adam": 2, "sgd": 0}


def training_bytes(parameters: int, optimizer: str, mode: str, batch: int, processes: int) -> int:
    """The module docstring's estimate for ``parameters`` on ``processes`` processes."""
    per_sample = batch if mode == "hooks" else 1
    per_parameter = 2 + OPTIMIZER_STATES[optimizer] + SECURE_DRAWS + 1 + per_sample
    return PARAMETER_BYTES * parameters * per_parameter * processes


def memory_problem(job: DPSGDJob, memory: int, processes: int, rows: int | None) -> str | None:
    """Why ``memory`` bytes cannot hold the job's training, or None (also when the model's
    sizes come from the blocks' declarations: it is not known before the job starts). The
    expected batch is the job's, else q · ``rows`` (the selected blocks' public row count)."""
    try:
        data = shape_only(job)
    except ValueError:
        return None
    model = initial_model(job, data)
    mode = job.grad_sample_mode or default_mode(model)
    batch = int(job.expected_batch_size or max(1, round(job.sample_rate * (rows or 0))))
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    need = training_bytes(parameters, job.optimizer, mode, batch, processes)
    if need <= memory:
        return None
    return (
        f"the model's {parameters:,} parameters need at least {need / 2**20:.3g} MiB to train "
        f"({job.optimizer}, {mode}, {processes} process(es)) but the job asks for {memory / 2**20:.3g} MiB"
    )
