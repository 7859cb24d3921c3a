"""`rlbench doctor`: what this machine offers rlbench."""

from __future__ import annotations

from typing import Annotated, Any

import typer


def _probe() -> dict[str, Any]:
    import importlib.metadata as md
    import os
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
        dist = {"math_verify": "math-verify"}.get(name, name)
        try:
            report[name] = md.version(dist)
        except md.PackageNotFoundError:
            report[name] = None
    if report["vllm"]:
        try:
            from vllm.config import SpeculativeConfig  # noqa: F401

            report["vllm_speculative"] = "ngram / suffix methods importable"
        except Exception as err:
            report["vllm_speculative"] = f"not importable ({type(err).__name__})"
    from shutil import which

    report["py-spy"] = which("py-spy")
    data_dir = os.environ.get("RLBENCH_DATA_DIR")
    report["data_dir"] = data_dir or "unset (RLBENCH_DATA_DIR / --data-dir; else the HF hub)"
    if data_dir:
        report["data_files"] = sorted(p.name for p in Path(data_dir).glob("*.jsonl"))
    from reference_trainer.embedded import default_model_dir

    model = default_model_dir(build=False)
    report["embedded_model"] = (
        f"{model} ({'cached' if (model / 'config.json').is_file() else 'built on first use'})"
    )
    return report


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
        """Report torch, device, CUDA, NVML, vllm/ray, the data directory and the embedded model."""
        report = _probe()
        if as_json:
            import json

            typer.echo(json.dumps(report, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="rlbench doctor", show_header=False)
        for key, value in report.items():
            shown = "[red]not installed[/red]" if value is None else str(value)
            table.add_row(key, shown)
        Console().print(table)
