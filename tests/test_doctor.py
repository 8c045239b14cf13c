"""`verl-compat doctor`: report shape, the P40 acceptance run, secrets, --explain, the policy hook."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from verl_compat.decision import Decision
from verl_compat.detect import ENV_VAR

doctor = importlib.import_module("verl_compat.doctor")
REPO = Path(__file__).resolve().parents[1]
CPU_TORCH = torch.version.cuda is None


def _run_cli(*args: str, device: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    if device:
        env[ENV_VAR] = device
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "verl_compat.cli", "doctor", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_p40_json_acceptance() -> None:
    out = _run_cli("--json", device="p40")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for section in ("device", "host", "torch", "packages", "capabilities", "policy", "env", "plugins", "problems"):
        assert section in report
    dev = report["device"]
    assert dev["compute_capability"] == [6, 1] and dev["compute_capability_str"] == "6.1"
    assert dev["native_bf16"] is False and dev["triton_capable"] is False and dev["simulated"] is True
    caps = report["capabilities"]
    assert caps["capability.native_bf16"]["value"] is False
    assert caps["capability.triton"]["value"] is False
    assert caps["capability.flash_attn"]["value"] is False
    if "kernels.triton" in report["policy"]:  # present once the resolvers (verl_compat.policy) exist
        assert report["policy"]["kernels.triton"]["value"] is False
    assert report["packages"]["triton"]["usable"] is False
    t = report["torch"]
    assert t["version"] == torch.__version__
    if CPU_TORCH:
        assert t["covers_device"] is False
        assert "no CUDA kernels" in t["reason"]
        assert "sm_61" in t["advice"] and "whl/cu126" in t["advice"] and "Tesla P40" in t["advice"]
        assert any("cu126" in p for p in report["problems"])
    for entry in report["policy"].values():
        assert {"value", "defaulted", "reasons"} <= set(entry)


def test_unknown_device_is_loud() -> None:
    out = _run_cli("--json", device="p41")
    assert out.returncode == 2
    assert "p41" in out.stderr and "p40" in out.stderr and "a100" in out.stderr


def test_text_report_sections(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_VAR, "t4")
    assert doctor.main([]) == 0
    text = capsys.readouterr().out
    for title in (
        "== Device ==",
        "== Host (the machine used) ==",
        "== PyTorch build ==",
        "== Optional packages ==",
        "== Policy",
        "== Problems ==",
    ):
        assert title in text
    assert "7.5" in text and "64 KiB" in text


def test_cpu_report_runs() -> None:
    report = doctor.build_report()
    assert report["device"]["device_type"] in ("cpu", "cuda")
    json.dumps(report, default=str)


def test_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "HF_TOKEN": "hf_abc",
        "WANDB_API_KEY": "w123",
        "VERL_SECRET_THING": "s3cr3t",
        "RAY_REDIS_PASSWORD": "pw",
        "VERL_COMPAT_DEVICE": "p40",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_HUB_OFFLINE": "1",
        "HOME": "/root",
    }
    out = doctor.env_section(env)
    assert out["HF_TOKEN"] == "<set>" and out["VERL_SECRET_THING"] == "<set>" and out["RAY_REDIS_PASSWORD"] == "<set>"
    assert out["VERL_COMPAT_DEVICE"] == "p40" and out["CUDA_VISIBLE_DEVICES"] == "0,1" and out["HF_HUB_OFFLINE"] == "1"
    assert "HOME" not in out and "WANDB_API_KEY" not in out  # not a relevant prefix at all

    monkeypatch.setenv("VERL_COMPAT_API_KEY", "hunter2")
    monkeypatch.setenv("HF_TOKEN", "hf_xyz")
    report = doctor.build_report()
    text = json.dumps(report, default=str) + doctor.render_text(report)
    assert "hunter2" not in text and "hf_xyz" not in text


def test_explain(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_VAR, "p40")
    assert doctor.main(["--explain", "capability.triton"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("capability.triton = False") and "7.0" in out
    assert doctor.main(["--explain", "capability"]) == 0  # a prefix explains every matching category
    assert "capability.native_bf16 = False" in capsys.readouterr().out
    assert doctor.main(["--explain", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "capability.native_bf16" in err and "capability.triton" in err


def test_policy_module_is_used_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def default_policy(profile, overrides, config_file):
        seen.update(profile=profile.name, overrides=overrides, config_file=config_file)
        return {"dtype.train": Decision("dtype.train", "actor.dtype", "float32", True, profile.describe())}

    fake = types.ModuleType("verl_compat.policy")
    fake.default_policy = default_policy
    monkeypatch.setitem(sys.modules, "verl_compat.policy", fake)
    monkeypatch.setenv(ENV_VAR, "p40")
    report = doctor.build_report(overrides=["actor.dtype=fp32"], config_file="ppo.yaml")
    assert seen == {"profile": "p40", "overrides": ["actor.dtype=fp32"], "config_file": "ppo.yaml"}
    assert report["policy_source"] == "verl_compat.policy"
    assert report["policy"]["dtype.train"]["value"] == "float32"


def test_policy_falls_back_to_detection_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verl_compat.policy", None)  # import raises ModuleNotFoundError
    monkeypatch.setenv(ENV_VAR, "a100")
    report = doctor.build_report()
    assert report["policy_source"] == "detection"
    assert report["policy"]["capability.native_bf16"]["value"] is True
    assert report["capabilities"]["capability.native_bf16"]["value"] is True


def test_incompatible_override_is_reported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_compat.errors import IncompatibleRequestError

    def default_policy(profile, overrides, config_file):
        raise IncompatibleRequestError("actor.dtype", "bfloat16", profile.describe(), "no bf16", "use float32")

    fake = types.ModuleType("verl_compat.policy")
    fake.default_policy = default_policy
    monkeypatch.setitem(sys.modules, "verl_compat.policy", fake)
    monkeypatch.setenv(ENV_VAR, "p40")
    assert doctor.main(["--json", "actor.dtype=bfloat16"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("use float32" in e for e in report["errors"])


def test_broken_section_does_not_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom():
        raise RuntimeError("torch is on fire")

    monkeypatch.setattr(doctor, "coverage_of", lambda _profile: boom())
    report = doctor.build_report()
    assert "Could not collect" in report["torch"]["error"]
    assert "Could not collect" in doctor.render_text(report)


def test_json_carries_every_candidate_with_structured_reasons() -> None:
    out = _run_cli("--json", device="p40")
    report = json.loads(out.stdout)
    attn = report["policy"]["attention"]
    values = [c["value"] for c in attn["candidates"]]
    assert values[:1] == ["flash_attention_2"] and "sdpa" in values and "eager" in values
    fa2 = attn["candidates"][0]
    assert fa2["accepted"] is False
    assert fa2["reasons"][0] == {
        "code": "cc_too_old",
        "message": "flash-attn 2 needs compute capability >= 8.0, device has 6.1",
        "hard": True,
        "actual": "6.1",
        "required": ">= 8.0",
    }
    for entry in report["policy"].values():
        for c in entry["candidates"]:
            assert {"value", "accepted", "reasons"} <= set(c)
            assert all({"code", "message", "hard", "actual", "required"} <= set(r) for r in c["reasons"])


def test_explain_prints_the_same_record_as_json(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "v100")
    report = doctor.build_report()
    expected = Decision.from_dict(report["policy"]["dtype.train"]).explain()
    assert doctor.main(["--explain", "dtype.train"]) == 0
    out = capsys.readouterr().out
    assert out.strip().split("\n\n")[0] == expected
    assert "- 'bf16': no_native_bf16: needs native bf16 (compute capability >= 8.0), device has 7.0" in out


def test_a100_without_flash_attn_defaults_to_sdpa_with_the_reason() -> None:
    """`VERL_COMPAT_DEVICE=a100 verl-compat doctor --json` on a machine without flash-attn (this one)."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    report = json.loads(_run_cli("--json", device="a100").stdout)
    assert report["packages"]["flash_attn"]["installed"] is False
    for cat in ("attention", "attention.critic"):
        attn = report["policy"][cat]
        assert attn["value"] == "sdpa" and attn["defaulted"] is True and attn["identity"] is False
        assert attn["upstream"] == "flash_attention_2"
        assert "not installed" in attn["reasons"][0]
        fa2 = next(c for c in attn["candidates"] if c["value"] == "flash_attention_2")
        assert [r["code"] for r in fa2["reasons"]] == ["not_installed"]
    # what upstream does where it runs is untouched: bf16, upstream's rollout dtype
    assert report["policy"]["dtype.train"]["value"] == "bf16" and report["policy"]["dtype.train"]["identity"]


def test_a_plugin_that_fails_to_load_shows_in_the_doctor(tmp_path: Path) -> None:
    """A real (dist-info) install of a plugin whose register() raises: its error is in --json and the text."""
    site = tmp_path / "site"
    dist = site / "broken_compat_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-compat-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[verl_compat.plugins]\nbroken = broken_compat_plugin:register\n")
    (site / "broken_compat_plugin.py").write_text(
        "def register(registry):\n    raise RuntimeError('needs xformers 0.0.99')\n"
    )
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(site) + os.pathsep + env_path
    try:
        report = json.loads(_run_cli("--json", device="v100").stdout)
        text = _run_cli(device="v100").stdout
    finally:
        os.environ["PYTHONPATH"] = env_path
    plugins = report["plugins"]
    assert {"name": "broken", "value": "broken_compat_plugin:register", "allowed": True} in plugins["entry_points"]
    assert plugins["load_errors"] == {"broken": "RuntimeError: needs xformers 0.0.99"}
    assert "load error: broken" in text and "needs xformers 0.0.99" in text


def test_host_section_is_the_machine_used() -> None:
    report = json.loads(_run_cli("--json", device="p40").stdout)
    assert report["device"]["description"].startswith("p40 (sm_61") and report["device"]["simulated"] is True
    host = report["host"]
    assert host["cpu_count"] >= 1 and host["memory_bytes"] > 0
    if CPU_TORCH and not host["accelerator"]:
        assert host["real_device"] == "cpu" and host["accelerator_via"] is None


def test_a_new_section_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def memory_plan(profile):
        return {"card memory": profile.describe(), "budget_gib": 20}

    def broken(profile):
        raise RuntimeError("no plan")

    monkeypatch.setitem(doctor.EXTRA_SECTIONS, "memory_plan", memory_plan)
    monkeypatch.setitem(doctor.EXTRA_SECTIONS, "broken_plan", broken)
    monkeypatch.setenv(ENV_VAR, "p40")
    report = doctor.build_report()
    assert report["memory_plan"] == {"card memory": "p40 (sm_61, 22.4 GiB, simulated)", "budget_gib": 20}
    assert "Could not collect" in report["broken_plan"]["error"]
    text = doctor.render_text(report)
    assert "== Memory plan ==" in text and "budget_gib:" in text and "no plan" in text
