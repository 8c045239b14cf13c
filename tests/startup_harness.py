"""Run verl's own `main_ppo` entry point in this process, the way a user's command line reaches it, and record
whether it got as far as Ray or a model load.

`ray.init` and every `from_pretrained` of transformers are replaced by recorders that stop the run there, so a
test can assert both "refused before Ray / model loading" and, for a valid job, "reached Ray" (the control that
shows the recorders work). Hydra's own output folder and logging are pointed at the test's tmp folder; those
overrides go to Hydra, not to the job, and never count as the user's requests.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

QUICKSTART_CONFIG = Path(__file__).resolve().parents[1] / "verl_compat" / "quickstart" / "config"


class ReachedRay(BaseException):  # not an Exception: Hydra must not catch it
    """Raised by the recording ray.init: the job passed every start-up check (Hydra lets it through)."""


@dataclass
class StartupResult:
    code: int | None  # SystemExit code; None when the job reached Ray
    err: str
    out: str
    reached: list[str] = field(default_factory=list)  # "ray.init", "AutoTokenizer.from_pretrained", ...
    config_reads: list[str] = field(default_factory=list)  # model folders whose config.json was read (no weights)

    @property
    def message(self) -> str:
        return self.err + self.out


def tiny_model_dir(root: Path) -> Path:
    """A Hugging Face model folder (config + tokenizer + weights) of a 2-layer random Llama."""
    from verl_compat.quickstart.model import tiny_llama

    return tiny_llama(root / "tiny-llama")


def parquet_file(path: Path, rows: int = 4) -> Path:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        {
            "data_source": ["t"] * rows,
            "prompt": [[{"role": "user", "content": f"{i}+1="}] for i in range(rows)],
            "reward_model": [{"ground_truth": str(i + 1), "style": "rule"} for i in range(rows)],
        }
    )
    frame.to_parquet(path)
    return path


def run_main(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    workdir: Path,
    argv: list[str],
    *,
    config_path: Path = QUICKSTART_CONFIG,
    config_name: str = "grpo",
) -> StartupResult:
    """`python -m verl.trainer.main_ppo --config-path=... --config-name=... ARGV` in this process."""
    import ray
    import transformers
    from hydra.core.global_hydra import GlobalHydra

    import verl.trainer.main_ppo as main_ppo

    reached: list[str] = []

    def record_ray(*_a, **_k):
        reached.append("ray.init")
        raise ReachedRay

    def recorder(name: str):
        def load(cls, *_a, **_k):
            reached.append(f"{name}.from_pretrained")
            raise AssertionError(f"{name}.from_pretrained called before start-up checks finished")

        return classmethod(load)

    config_reads: list[str] = []
    read_config = transformers.AutoConfig.from_pretrained.__func__

    def record_config(cls, path, *a, **k):  # the memory plan reads config.json (no weights): allowed, recorded
        config_reads.append(str(path))
        return read_config(cls, path, *a, **k)

    monkeypatch.setattr(ray, "init", record_ray)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(record_config))
    for name in ("AutoTokenizer", "AutoModelForCausalLM", "AutoProcessor", "PreTrainedModel"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", recorder(name))
    monkeypatch.chdir(workdir)
    hydra_own = [f"hydra.run.dir={workdir / 'hydra'}", "hydra.output_subdir=null", "hydra/job_logging=none"]
    hydra_own.append("hydra/hydra_logging=none")
    args = [f"--config-path={config_path}", f"--config-name={config_name}", *argv, *hydra_own]
    monkeypatch.setattr(sys, "argv", ["main_ppo.py", *args])
    GlobalHydra.instance().clear()
    capsys.readouterr()
    code: int | None = None
    try:
        main_ppo.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except ReachedRay:
        code = None
    finally:
        GlobalHydra.instance().clear()
    captured = capsys.readouterr()
    assert not ray.is_initialized()
    return StartupResult(code, captured.err, captured.out, reached, config_reads)


def assert_refused(result: StartupResult, *parts: str, code: int = 2) -> None:
    """Exit code, nothing reached, one short message (no traceback, no Hydra override dump) naming `parts`."""
    assert result.code == code, f"exit code {result.code}, output:\n{result.message}"
    assert result.reached == [], f"reached {result.reached} before refusing"
    assert "Traceback" not in result.message and "Error executing job" not in result.message, result.message
    for part in parts:
        assert part in result.err, f"{part!r} missing from the message:\n{result.err}"
    assert "Fix:" in result.err, result.err
