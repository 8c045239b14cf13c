"""`verl-compat doctor`: what this device is, what the torch build and packages can do on it, and the policy.

Shaped like torch.utils.collect_env: `build_report()` returns one plain record (the `--json` output); the text
printer and `--explain` render that same record, and anything that cannot be read shows as "Could not collect"
instead of crashing. Device and torch facts come from the profile (detect), plugin state from the plugin loader,
decisions from the resolvers: the doctor decides nothing itself. Imports neither verl nor ray.

A new section is one entry in `EXTRA_SECTIONS` (name -> `(profile) -> dict`): it lands in the record under its
name (a failure becomes "Could not collect") and the text report prints it as key: value lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

from verl_compat import capabilities
from verl_compat.catalog import CATALOG
from verl_compat.decision import Decision
from verl_compat.detect import ENV_VAR, detect
from verl_compat.errors import VerlCompatError
from verl_compat.packages import PACKAGE_NAMES, hardware_reasons
from verl_compat.profile import DeviceProfile
from verl_compat.torch_build import coverage_of

logger = logging.getLogger("verl_compat.doctor")

NOT_COLLECTED = "Could not collect"
PLUGIN_GROUP = "verl_compat.plugins"
ENV_PREFIXES = (
    "VERL_",
    "RAY_",
    "CUDA_",
    "NCCL_",
    "TORCH",
    "PYTORCH_",
    "HF_",
    "TRANSFORMERS_",
    "VLLM_",
    "SGLANG_",
    "TRITON_",
    "XFORMERS_",
    "NVIDIA_",
    "OMP_NUM_THREADS",
)
SECRET_TERMS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "PRIVATE")
DETECTED = "(detected)"  # Decision.key for detection-only entries: they fill no config key

# Further sections, in order: name -> function of the profile returning a JSON-serialisable dict.
EXTRA_SECTIONS: dict[str, Callable[[DeviceProfile], dict[str, Any]]] = {}


# report sections ------------------------------------------------------------------------------------------------
def device_section(profile: DeviceProfile) -> dict[str, Any]:
    d = profile.to_dict()
    for k in ("packages", "torch_version", "torch_cuda_version", "torch_arch_list", "torch_covers_device"):
        d.pop(k, None)
    cc = profile.compute_capability
    d["compute_capability_str"] = f"{cc[0]}.{cc[1]}" if cc else None
    d["sm"] = profile.sm
    d["description"] = profile.describe()
    entry = CATALOG.get(profile.name) if profile.simulated else None
    d["model"] = entry.model if entry else profile.name
    if entry and entry.note:
        d["note"] = entry.note
    return d


def host_section(profile: DeviceProfile) -> dict[str, Any]:
    """The machine used (detect.host / real_device), apart from the card decided for (`device`)."""
    from verl_compat.detect import host, real_device

    facts = host().to_dict()
    facts["real_device"] = real_device().describe()
    return facts


def torch_section(profile: DeviceProfile) -> dict[str, Any]:
    """The torch build as detect() recorded it in the profile (read once per process), and its coverage."""
    cov = coverage_of(profile)
    return {
        "version": profile.torch_version,
        "cuda": profile.torch_cuda_version,
        "hip": profile.torch_hip_version,
        "arch_list": list(profile.torch_arch_list),
        "covers_device": cov.covers,
        "reason": cov.reason,
        "advice": cov.advice,
        "error": profile.torch_error,
    }


def packages_section(profile: DeviceProfile) -> dict[str, Any]:
    out = {}
    for name in PACKAGE_NAMES:
        st = profile.package(name)
        out[name] = {
            "installed": st.installed,
            "version": st.version,
            "usable": st.usable,
            "reason": st.reason,
            "note": st.note,
        }
    return out


def detection_policy(profile: DeviceProfile) -> dict[str, Decision]:
    """What detection alone decides ("capability.*"): always reported under "capabilities", and the policy itself
    until a resolver module (verl_compat.policy) exists."""
    cc = profile.compute_capability
    where = profile.describe()
    cc_txt = capabilities.cc_text(cc) if cc else "none"
    bf16_cc, triton_cc = capabilities.cc_text(capabilities.NATIVE_BF16_CC), capabilities.cc_text(capabilities.TRITON_CC)

    def pkg(category: str, name: str, label: str) -> Decision:
        st = profile.package(name)
        if not st.installed:
            why = f"{label} is not installed"
            hw = hardware_reasons(name, profile)
            why += f" (and could not run here: {'; '.join(hw)})" if hw else ""
        elif st.usable:
            why = f"{label} {st.version} is usable" + (f" ({st.note})" if st.note else "")
        else:
            why = f"{label} {st.version} is installed but not usable: {st.reason}"
        return Decision(category, DETECTED, st.usable, True, where, reasons=(why,))

    if profile.native_bf16:
        bf16_why = f"compute capability {cc_txt} >= {bf16_cc}: bf16 tensor cores"
    elif profile.is_cpu:
        bf16_why = "CPU device: fp32 (bf16 on CPU is slow without AVX512-BF16/AMX)"
    else:
        bf16_why = f"compute capability {cc_txt} < {bf16_cc}: bf16 would be emulated or fail (cuBLAS); use fp16/fp32"
    fp16_why = (
        "tensor cores or packed fp16"
        if profile.fast_fp16
        else "no tensor cores and no packed fp16 (sm_61 runs fp16 at 1/64 rate; GTX 16xx/CPU: fp32)"
    )
    triton = profile.package("triton")
    if not profile.triton_capable:
        triton_why = (
            f"device cannot run Triton (needs a CUDA device with compute capability >= {triton_cc}; has {cc_txt})"
        )
    elif not triton.installed:
        triton_why = "device can run Triton, but triton is not installed"
    else:
        triton_why = triton.reason or triton.note or f"triton {triton.version} is usable"
    return {
        "capability.native_bf16": Decision(
            "capability.native_bf16", DETECTED, profile.native_bf16, True, where, (), (bf16_why,)
        ),
        "capability.fast_fp16": Decision(
            "capability.fast_fp16", DETECTED, profile.fast_fp16, True, where, (), (fp16_why,)
        ),
        "capability.triton": Decision(
            "capability.triton", DETECTED, profile.triton_capable and triton.usable, True, where, (), (triton_why,)
        ),
        "capability.flash_attn": pkg("capability.flash_attn", "flash_attn", "flash-attn"),
        "capability.xformers": pkg("capability.xformers", "xformers", "xformers"),
        "capability.vllm": pkg("capability.vllm", "vllm", "vLLM"),
        "capability.sglang": pkg("capability.sglang", "sglang", "SGLang"),
    }


def resolve_policy(
    profile: DeviceProfile, overrides: list[str], config_file: str | None
) -> tuple[dict[str, Decision], str]:
    """(decisions, source): `verl_compat.policy.default_policy` when that module exists, else detection only.

    Only a missing `verl_compat.policy` module falls back; an ImportError inside it is a bug and propagates.
    """
    try:
        from verl_compat.policy import default_policy
    except ModuleNotFoundError as e:
        if e.name != "verl_compat.policy":
            raise
        logger.debug("verl_compat.policy not available yet; detection-only policy")
        return detection_policy(profile), "detection"
    return dict(default_policy(profile, overrides, config_file)), "verl_compat.policy"


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(term in upper for term in SECRET_TERMS)


def env_section(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    out = {}
    for name in sorted(environ):
        if name.upper().startswith(ENV_PREFIXES):
            out[name] = "<set>" if is_secret(name) else environ[name]
    return out


def plugins_section() -> dict[str, Any]:
    """Entry points found, and what the loader did with each (build_report loads plugins before this runs)."""
    from verl_compat.plugins import plugin_status

    allow = os.environ.get("VERL_COMPAT_PLUGINS")
    allowed = None if allow is None else {a.strip() for a in allow.split(",") if a.strip()}
    found: list[dict[str, Any]] = []
    try:
        for ep in metadata.entry_points(group=PLUGIN_GROUP):
            found.append({"name": ep.name, "value": ep.value, "allowed": allowed is None or ep.name in allowed})
    except Exception as e:
        return {"group": PLUGIN_GROUP, "allowlist": allow, "entry_points": [], "error": f"{NOT_COLLECTED}: {e!r}"}
    status = plugin_status()
    return {
        "group": PLUGIN_GROUP,
        "allowlist": allow,
        "entry_points": found,
        "loaded": [st.name for st in status if st.loaded],
        "load_errors": {st.name: st.error for st in status if not st.loaded},
    }


def _problems(profile: DeviceProfile, torch_info: dict[str, Any]) -> list[str]:
    problems = []
    if torch_info.get("covers_device") is False:
        problems.append(f"{torch_info['reason']}. Fix: {torch_info['advice']}")
    if torch_info.get("error"):
        problems.append(str(torch_info["error"]))
    for name, st in profile.packages.items():
        if st.reason.startswith("could not check"):
            problems.append(f"{name}: {st.reason}")
    return problems


def _section(fn: Any, *args: Any) -> Any:
    """Run one section; a failure becomes a 'Could not collect' entry rather than a crash."""
    try:
        return fn(*args)
    except Exception as e:
        logger.debug("doctor section %s failed", getattr(fn, "__name__", fn), exc_info=True)
        return {"error": f"{NOT_COLLECTED}: {type(e).__name__}: {e}"}


def build_report(
    profile: DeviceProfile | None = None, overrides: list[str] | None = None, config_file: str | None = None
) -> dict[str, Any]:
    """The doctor's structured record. Raises only UnknownDeviceProfileError (bad VERL_COMPAT_DEVICE)."""
    from verl_compat.plugins import load_plugins

    profile = profile if profile is not None else detect()
    load_plugins()  # before the plugin section and the policy: both show what the loader did
    torch_info = _section(torch_section, profile)
    report: dict[str, Any] = {
        "device": _section(device_section, profile),
        "host": _section(host_section, profile),
        "torch": torch_info,
        "packages": _section(packages_section, profile),
        "env": _section(env_section),
        "plugins": _section(plugins_section),
        **{name: _section(fn, profile) for name, fn in EXTRA_SECTIONS.items()},
        "errors": [],
    }
    caps = _section(detection_policy, profile)
    if isinstance(caps, dict) and "error" not in caps:
        report["capabilities"] = {cat: d.to_dict() for cat, d in sorted(caps.items())}
    else:
        report["capabilities"] = caps
    try:
        decisions, source = resolve_policy(profile, list(overrides or []), config_file)
        report["policy"] = {cat: d.to_dict() for cat, d in sorted(decisions.items())}
        report["policy_source"] = source
    except VerlCompatError as e:  # e.g. IncompatibleRequestError for an explicit override: show it, exit 1
        report["policy"] = {}
        report["errors"].append(str(e))
    except Exception as e:
        logger.debug("policy resolution failed", exc_info=True)
        report["policy"] = {}
        report["errors"].append(f"policy: {NOT_COLLECTED}: {type(e).__name__}: {e}")
    report["problems"] = _problems(profile, torch_info) + list(report["errors"])
    report["notes"] = []
    if profile.simulated:
        report["notes"].append(
            f"simulated device {profile.name!r} ({ENV_VAR}={os.environ.get(ENV_VAR, profile.name)}): "
            "hardware facts come from the catalog, software facts (torch, packages) from this machine"
        )
    return report


# rendering ------------------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None or value == "":
        return NOT_COLLECTED
    if isinstance(value, bool):
        return "Yes" if value else "No"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else "(none)"
    return str(value)


def render_text(report: dict[str, Any]) -> str:
    lines: list[str] = ["verl-compat doctor"]

    def header(title: str) -> None:
        lines.extend(["", f"== {title} =="])

    def kv(key: str, value: Any) -> None:
        lines.append(f"{key + ':':<34} {_fmt(value)}")

    dev = report.get("device", {})
    header("Device")
    if "error" in dev:
        kv("error", dev["error"])
    else:
        kv("profile", dev.get("description"))
        kv("model", dev.get("model"))
        kv("simulated", dev.get("simulated"))
        kv("device type", dev.get("device_type"))
        kv("device count", dev.get("device_count"))
        kv("compute capability", dev.get("compute_capability_str") if dev.get("device_type") != "cpu" else "n/a")
        mem = dev.get("total_memory_bytes")
        kv("total memory", f"{mem / 2**30:.1f} GiB ({mem} bytes)" if mem else None)
        smem = dev.get("shared_memory_per_block_optin")
        kv("shared memory per block (opt-in)", f"{smem // 1024} KiB" if smem else None)
        kv("SM count", dev.get("sm_count"))
        for key in ("native_bf16", "fast_fp16", "tensor_cores", "triton_capable"):
            kv(key, dev.get(key))
        if dev.get("note"):
            kv("note", dev["note"])

    h = report.get("host", {})
    header("Host (the machine used)")
    if "error" in h:
        kv("error", h["error"])
    else:
        kv("CPUs", h.get("cpu_count"))
        mem = h.get("memory_bytes")
        kv("memory", f"{mem / 2**30:.1f} GiB" if mem else None)
        kv("accelerator", f"yes (seen by {h['accelerator_via']})" if h.get("accelerator") else "none")
        kv("real device", h.get("real_device"))

    t = report.get("torch", {})
    header("PyTorch build")
    kv("torch", t.get("version"))
    kv("CUDA", t.get("cuda") or ("ROCm " + t["hip"] if t.get("hip") else "No CUDA"))
    kv("arch list", t.get("arch_list"))
    kv("covers this device", t.get("covers_device") if t.get("covers_device") is not None else "n/a")
    kv("why", t.get("reason"))
    if t.get("advice"):
        kv("fix", t["advice"])
    if t.get("error"):
        kv("error", t["error"])

    header("Optional packages")
    for name, st in (report.get("packages") or {}).items():
        if name == "error":
            kv("error", st)
            continue
        if not st["installed"]:
            status = "not installed"
        elif st["usable"]:
            status = f"{st['version'] or '?'}: usable" + (f" ({st['note']})" if st["note"] else "")
        else:
            status = f"{st['version'] or '?'}: NOT usable: {st['reason']}"
        kv(name, status)

    header("Capabilities (detected)")
    for cat, d in (report.get("capabilities") or {}).items():
        if cat == "error":
            kv("error", d)
            continue
        lines.append(f"{cat} = {d.get('value')!r}")
        lines.extend(f"    {r}" for r in d.get("reasons", []))

    header(f"Policy (from {report.get('policy_source', 'n/a')})")
    for cat, d in (report.get("policy") or {}).items():
        how = "default" if d.get("defaulted") else "requested"
        lines.append(f"{cat} = {d.get('value')!r} ({how})")
        lines.extend(f"    {r}" for r in d.get("reasons", []))

    for name in EXTRA_SECTIONS:
        header(name.replace("_", " ").capitalize())
        for key, value in (report.get(name) or {}).items():
            kv(key, value)

    header("Environment variables")
    env = report.get("env") or {}
    if not env:
        lines.append("(none relevant set)")
    for k, v in env.items():
        kv(k, v)

    p = report.get("plugins") or {}
    header("Plugins")
    kv("entry-point group", p.get("group"))
    kv("allowlist (VERL_COMPAT_PLUGINS)", p.get("allowlist") or "(unset: all)")
    kv("entry points", [f"{e['name']}={e['value']}" for e in p.get("entry_points", [])])
    kv("loaded", p.get("loaded"))
    for name, error in (p.get("load_errors") or {}).items():
        kv(f"load error: {name}", error)
    if p.get("error"):
        kv("error", p["error"])

    header("Problems")
    problems = report.get("problems") or []
    lines.extend(f"- {x}" for x in problems) if problems else lines.append("(none)")
    lines.extend(f"note: {x}" for x in report.get("notes") or [])
    lines.extend(["", "Paste this report (or `verl-compat doctor --json`) into your issue."])
    return "\n".join(lines)


def decisions_of(report: dict[str, Any]) -> dict[str, Decision]:
    """Every decision in the record (capabilities and policy), rebuilt from its serialised form."""
    out: dict[str, Decision] = {}
    for section in ("capabilities", "policy"):
        for cat, d in (report.get(section) or {}).items():
            if isinstance(d, dict) and "category" in d:
                out[cat] = Decision.from_dict(d)
    return out


def _match_categories(decisions: dict[str, Decision], wanted: str) -> list[str]:
    """'attention' matches 'attention' and 'attention.*'; an exact category matches itself."""
    return [c for c in sorted(decisions) if c == wanted or c.startswith(wanted + ".")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-compat doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--explain", metavar="CATEGORY", help="explain the decisions of one category (or prefix)")
    parser.add_argument("--config", metavar="FILE", help="verl config file to resolve the policy for")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides, e.g. actor_rollout_ref.rollout.dtype=fp16")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    try:
        report = build_report(overrides=args.overrides, config_file=args.config)
    except VerlCompatError as e:  # unknown VERL_COMPAT_DEVICE: loud, with the valid names
        print(f"verl-compat doctor: {e}", file=sys.stderr)
        return 2
    decisions = decisions_of(report)

    if args.explain:
        cats = _match_categories(decisions, args.explain)
        if not cats:
            valid = ", ".join(sorted(decisions)) or "(none)"
            print(f"verl-compat doctor: unknown category {args.explain!r}; categories: {valid}", file=sys.stderr)
            return 2
        print("\n\n".join(decisions[c].explain() for c in cats))
    elif args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print(render_text(report))
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
