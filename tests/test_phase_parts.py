"""benchmarks/phase_parts.py: each trainer-worker call is named by the engine pass inside it (or by verl's PPO
order when the trace has no labels), TransferQueue's fetch and write are charged to the call they belong to, and
the medians skip the first step."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import phase_parts  # noqa: E402

PID = 7
W = "verl.workers.engine_workers.TrainingWorker."
E = "verl.workers.engine.fsdp.transformer_impl.FSDPEngine"


def _r(name, t0, t1, pid=PID, **extra):
    return {"pid": pid, "name": name, "t0": t0, "t1": t1, **extra}


def _step(t, scale, labels=True):
    """One PPO step from time t: three forward passes, then the critic's and the actor's updates (seconds)."""
    rows = []
    for i, (pass_, train) in enumerate(
        [
            ("actor.forward", False),
            ("ref.forward", False),
            ("critic.forward", False),
            ("critic.train", True),
            ("actor.train", True),
        ]
    ):
        s = t + i * 1.0
        rows.append(_r("verl.utils.transferqueue_utils._meta_to_realdata", s, s + 0.04 * scale))  # before the call
        w0 = s + 0.05
        rows.append(_r(W + ("train_batch" if train else "infer_batch"), w0, w0 + 0.5))
        extra = {"pass": pass_} if labels else {}
        rows.append(_r(E + ".forward_backward_batch", w0 + 0.01, w0 + 0.41, **extra))
        rows.append(_r("verl.workers.engine.utils.prepare_micro_batches", w0 + 0.01, w0 + 0.03))
        rows.append(_r("tensordict._td.TensorDict.to", w0 + 0.03, w0 + 0.04))
        rows.append(_r(E + "WithLMHead.forward_step", w0 + 0.04, w0 + 0.14))
        if train:
            rows.append(_r(E + ".optimizer_step", w0 + 0.42, w0 + 0.45))
        rows.append(_r("verl.utils.transferqueue_utils._update_meta_with_output", w0 + 0.51, w0 + 0.52))
    return rows


def test_phases_named_by_pass_and_parts_charged():
    trace = _step(0.0, scale=10) + _step(10.0, scale=1) + _step(20.0, scale=1)
    calls = phase_parts.calls(trace)
    assert [c["phase"] for c in calls[:5]] == list(phase_parts.PPO_ORDER)
    s = phase_parts.summary(trace)
    critic = s["update_critic"]["median_ms"]
    assert s["update_critic"]["calls"] == 3
    assert round(critic["tq_get"]) == 40  # the first step's 400 ms fetch is not in the median
    assert round(critic["tq_put"]) == 10
    assert round(critic["micro_batches"]) == 20 and round(critic["to_device"]) == 10
    assert round(critic["model"]) == 100 and round(critic["optimizer"]) == 30
    assert round(critic["backward"]) == 400 - 20 - 10 - 100  # the batch's span less what it runs itself
    assert s["values"]["median_ms"]["backward"] == 0.0  # forward-only
    assert round(critic["host_parts"]) == 40 + 10 + 20 + 10
    assert round(s["step_host_parts_ms"]) == 5 * 80


def test_unlabelled_trace_follows_verls_order():
    trace = _step(0.0, 1, labels=False) + _step(10.0, 1, labels=False)
    assert [c["phase"] for c in phase_parts.calls(trace)] == list(phase_parts.PPO_ORDER) * 2


def test_other_process_not_charged():
    trace = _step(0.0, 1) + [_r("verl.utils.transferqueue_utils._meta_to_realdata", 0.0, 5.0, pid=99)]
    assert round(phase_parts.summary(trace)["old_log_prob"]["median_ms"]["tq_get"]) == 40


def test_the_compat_move_counted_once():
    """Below sm_80 forward_step moves its micro-batch through verl_compat.batch_moves, which may call
    TensorDict.to inside (a lazy stack): one move, counted once."""
    trace = _step(0.0, 1) + _step(10.0, 1)
    for r in [r for r in trace if r["name"] == "tensordict._td.TensorDict.to"]:
        trace.append(_r("verl_compat.batch_moves.to_device", r["t0"] - 0.005, r["t1"]))
    critic = phase_parts.summary(trace)["update_critic"]["median_ms"]
    assert round(critic["to_device"]) == 15
    assert round(critic["backward"]) == 400 - 20 - 15 - 100
