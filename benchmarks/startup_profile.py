"""Where the start-up time of a verl job goes, before step 1: Ray, TransferQueue, worker init, each model load,
the rollout server, the first weight sync. Runs the job once with a tracer in every process
(benchmarks/startup_trace/sitecustomize.py, nothing of verl edited) and prints a timeline.

    python benchmarks/startup_profile.py --out benchmarks/results/startup_cpu_tiny_ppo.json
    python benchmarks/startup_profile.py -- python -m verl.trainer.main_ppo ...   # any job command

Default job: `verl-compat quickstart --algo ppo --model tiny --steps 1` (PPO with a critic on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ppo_job  # noqa: E402  (startup_timeline: the trace as a timeline, shared with the job benchmarks)


def run(cmd: list[str], trace: Path, metrics: Path, timeout_s: float) -> tuple[int, float, float | None]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "startup_trace"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        VERL_COMPAT_STARTUP_TRACE=str(trace),
        VERL_FILE_LOGGER_PATH=str(metrics),
        RAY_AUTH_MODE="disabled",
        HF_HUB_OFFLINE="1",
    )
    t0 = time.time()
    first_metrics = None
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        if first_metrics is None and metrics.is_file() and metrics.stat().st_size:
            first_metrics = time.time()
        if time.time() - t0 > timeout_s:
            proc.kill()
            break
    rc = proc.wait()
    if first_metrics is None and metrics.is_file() and metrics.stat().st_size:
        first_metrics = metrics.stat().st_mtime
    (trace.parent / "job.log").write_text("".join(log))
    return rc, t0, first_metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--min-s", type=float, default=0.2, help="hide calls shorter than this")
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a verl override for the default job"
    )
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="startup-"))
    cmd = [c for c in args.cmd if c != "--"] or [
        sys.executable,
        "-m",
        "verl_compat.cli",
        "quickstart",
        "--algo",
        "ppo",
        "--model",
        "tiny",
        "--steps",
        "1",
        "--home",
        str(work / "home"),
        "--out",
        str(work / "ckpt"),
        "--train-size",
        "16",
        "--val-size",
        "4",
        "trainer.logger=[console,file]",
        "trainer.save_freq=-1",
        *args.set,
    ]
    trace, metrics = work / "trace.jsonl", work / "metrics.jsonl"
    rc, t0, first = run(cmd, trace, metrics, args.timeout_s)
    events = ppo_job.startup_timeline(trace, t0, min_s=0.0)
    fit = next((e for e in events if e["name"].endswith("PPOTrainer.fit")), None)
    report = {
        "cmd": cmd,
        "returncode": rc,
        "work": str(work),
        "before_step1_s": fit["start_s"] if fit else None,  # fit() is entered right before step 1 (no validation)
        "first_metrics_s": round(first - t0, 1) if first else None,
        "processes": sorted({(e["proc"], e["pid"], e["proc_start_s"]) for e in events}),
        "events": events,
    }
    for e in events:
        if e["dur_s"] >= args.min_s:
            print(f"p{e['proc']:<2} +{e['start_s']:7.2f} s  {e['dur_s']:7.2f} s  {e['name']}")
    print(
        f"returncode {rc}; step 1 starts at {report['before_step1_s']} s; first metrics at "
        f"{report['first_metrics_s']} s; {len(report['processes'])} traced processes (log: {work}/job.log)"
    )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
