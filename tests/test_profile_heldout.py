"""`rlbench profile` ends its summary with what the run learnt: the final held-out accuracy."""

from __future__ import annotations

from conftest import cli

from rlbench.commands.profile import heldout_line


def test_the_heldout_line_reads_the_final_evaluation_beside_the_first() -> None:
    heldout = {
        "task": "arith",
        "problems": 64,
        "curve": [
            {"step": 0, "samples": 0, "greedy_acc": 0.25, "pass1": 0.2},
            {"step": 8, "samples": 512, "greedy_acc": 0.4375, "pass1": 0.41},
        ],
    }
    assert heldout_line(heldout) == (
        "held-out greedy accuracy after step 8: 0.438 (pass@1 0.410; step 0: 0.250; 64 problems)"
    )
    assert heldout_line(None) == "held-out accuracy: n/a (the run made no held-out evaluation)"


def test_profile_prints_the_final_heldout_accuracy(tiny_model_dir, tmp_path) -> None:
    args = (
        "--model",
        str(tiny_model_dir),
        "--prompts-per-step",
        "1",
        "--group-size",
        "2",
        "--max-tokens",
        "4",
    )
    res = cli("profile", "--out", "p", "--steps", "1", "--eval-every", "1", *args, tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "held-out greedy accuracy after step 1: " in res.stdout
