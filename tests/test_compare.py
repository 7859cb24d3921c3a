"""`rlbench compare`: modes side by side, one step of each in turn, with the per-round spread of the
speed-up and a machine-load drift check (reference_trainer/trace/metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli

from reference_trainer.trace.compare import drift_check, step_speedups
from rlbench.report.compare_report import render_compare


def test_step_speedups_are_per_round_ratios() -> None:
    steps = {
        "baseline": [{"step": 0, "step_time_s": 4.0}, {"step": 1, "step_time_s": 6.0}],
        "sorted": [{"step": 0, "step_time_s": 2.0}, {"step": 1, "step_time_s": 4.0}],
    }
    spread = step_speedups(steps, "baseline")
    assert spread["baseline"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert spread["sorted"] == {"median": 1.75, "min": 1.5, "max": 2.0}


@pytest.mark.parametrize(
    ("costs", "flagged"), [((1.0, 1.4), False), ((1.0, 1.6), True), ((1.0, None), False)]
)
def test_drift_is_flagged_beyond_the_tolerance(costs, flagged) -> None:
    drift = drift_check(
        {"baseline": {"update_s_per_ktoken": costs[0]}, "rhyme": {"update_s_per_ktoken": costs[1]}}
    )
    assert drift["flagged"] is flagged and drift["tolerance"] == 1.5


def test_compare_interleaves_the_modes_and_reports_spread_and_drift(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cmp"
    res = cli("compare", "--modes", "baseline,sorted", "--steps", "2", "--model", str(tiny_model_dir),
              "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "12", "--eval-every", "0",
              "--device", "cpu", "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    order = [line.split()[2].rstrip(":") for line in res.stdout.splitlines() if line.startswith("step ")]
    assert order == ["baseline", "sorted", "baseline", "sorted"]  # one step of each in turn
    doc = json.loads((out / "compare.json").read_text())
    assert doc["interleaved"] is True and doc["workload"]["threads"] >= 1
    assert set(doc["speedup_per_round"]) == {"baseline", "sorted"}
    assert doc["speedup_per_round"]["baseline"]["min"] == pytest.approx(1.0)
    costs = doc["drift"]["s_per_ktoken"]
    assert set(costs) == {"baseline", "sorted"} and all(c > 0 for c in costs.values())
    for mode in ("baseline", "sorted"):
        run = json.loads((out / mode / "metrics.json").read_text())
        assert run["summary"]["steps"] == 2
        # each session counts only its own steps: its wall time is the sum of its step times, not the whole
        own = sum(s["step_time_s"] for s in run["steps"])
        assert own <= run["run"]["wall_time_s"] < own + 5.0


def test_a_drifted_comparison_says_so_on_the_page(tmp_path: Path) -> None:
    runs = [
        {
            "mode": m,
            "summary": {"step_time_s": t, "update_s_per_ktoken": c},
            "steps": [{"step": 0, "step_time_s": t}],
        }
        for m, t, c in (("baseline", 2.0, 1.0), ("rhyme", 1.0, 2.5))
    ]
    page = render_compare(tmp_path, {"baseline": "baseline", "runs": runs}).read_text()
    assert "Machine load drifted during this comparison" in page and "2.50x apart" in page


def test_columns_no_run_measured_are_named_not_left_blank(tmp_path: Path) -> None:
    def run(mode: str, gpu_idle: float | None) -> dict:
        summary = {"step_time_s": 1.0, "bubble_ratio": 0.5, "bubble_ratio_gpu": gpu_idle}
        return {"mode": mode, "summary": summary, "steps": [{"step": 0, "step_time_s": 1.0}]}

    (tmp_path / "cpu").mkdir(), (tmp_path / "gpu").mkdir()
    cpu = render_compare(tmp_path / "cpu", {"runs": [run("baseline", None), run("sorted", None)]}).read_text()
    assert "<th>GPU idle in rollout</th>" not in cpu and "<th>acceptance</th>" not in cpu
    assert "Not measured here: " in cpu and "GPU idle in rollout (NVML" in cpu
    assert "acceptance (no mode drafts" in cpu
    gpu = render_compare(tmp_path / "gpu", {"runs": [run("baseline", 0.85), run("sorted", None)]}).read_text()
    assert "<th>GPU idle in rollout</th>" in gpu and "<td>0.85</td>" in gpu
    assert "GPU idle in rollout (" not in gpu


def test_profile_summary_shows_the_gpu_idle_share_beside_the_slot_bubble() -> None:
    from rlbench.commands.profile import bubble_lines

    assert bubble_lines({"bubble_ratio": 0.05, "bubble_ratio_gpu": None, "rollout_tokens_per_s": 10.0}) == [
        "bubble ratio 5.0% (slots), rollout 10.0 tok/s"
    ]
    engine_bound = bubble_lines(
        {"bubble_ratio": 0.022, "bubble_ratio_gpu": 0.85, "rollout_tokens_per_s": 1114}
    )
    assert (
        engine_bound[0] == "bubble ratio 2.2% (slots), GPU idle 85.0% of rollout (NVML), rollout 1114.0 tok/s"
    )
    assert "the engine itself" in engine_bound[1]
    assert len(bubble_lines({"bubble_ratio": 0.5, "bubble_ratio_gpu": 0.6, "rollout_tokens_per_s": 1})) == 1
