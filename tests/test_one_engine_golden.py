"""W = 1 is the in-process engine of before the multi-engine rollout, held to a golden trace.

tests/data/one_engine_golden.json was written by commit 6e89c49 (the code before rollout/multi.py and
rollout/dispatch.py existed) running `run_modes()` below: for each mode, a 2-step CPU run of the embedded
model on one thread: its trace stripped of every time, and each trained sample's token ids. The test runs
today's code with the same configs at `workers=1` (and sorted-partial with no worker count given) and
compares exactly. To rewrite the file (only from a commit whose W = 1 behaviour is the reference; a
difference from today's code is a behaviour change to explain, not to regenerate away):

    mkdir /tmp/old && git archive 6e89c49 | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/test_one_engine_golden.py tests/data/one_engine_golden.json

This module imports only what 6e89c49 already had, so the same function writes the file and checks it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "data" / "one_engine_golden.json"
# sorted+rhyme is left out: its verify width is chosen from a cost table corrected online by the measured
# step times (speculation/speculator.py), so its forwards, hence where the quota cuts, vary run to run on
# any commit (6e89c49's own code, run twice on one config, gave 46 events, then 52).
MODES = ("baseline", "sorted", "sorted-partial")
SORTED_OPTIONS = {"oversubscription": 2.0, "max_staleness": 2}
# Floats that come from the clock or the CPU's speed; the update's loss is left out too, as a float sum
# whose last bits may move with the BLAS build while its tokens (and every later token) do not.
TIMED = {"loss", "host_cpu_s", "forward_cpu_s", "drafting_cpu_s"}
FORWARD = ("kind", "step", "worker", "rows", "tokens", "input_tokens", "active_slots")  # a list each: small


def _config(mode: str, workers: int | None):
    from reference_trainer.train.config import TrainConfig

    kw = {} if workers is None else {"workers": workers}
    options = {} if mode == "baseline" else dict(SORTED_OPTIONS)
    config = TrainConfig(eval_every=0, steps=2, task="arith", mode=mode, prompts_per_step=2, group_size=2,
                         max_tokens=8, temperature=2.0, max_num_seqs=3, max_model_len=256, checkpoint_every=1,
                         mode_options=options, **kw)  # fmt: skip
    config.grpo.micro_batch_size = 4
    return config


def timing_free(events: list[dict]) -> list[dict]:
    """The trace's deterministic content, every event in order: a forward's kind, step and counts (not its
    slot map, to keep the file small), every other event's fields less its times (t_*, *_s) and loss."""
    return [
        [e[k] for k in FORWARD]
        if e["kind"] in ("prefill", "decode")
        else {k: v for k, v in e.items() if not k.startswith("t_") and k not in TIMED}
        for e in events
    ]


def run_mode(mode: str, workers: int | None) -> dict[str, list]:
    """The run's timing-free trace and, per step, each trained group's prompt position and the token ids of
    its samples (the trace holds only their counts)."""
    from reference_trainer.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(_config(mode, workers), Path(tmp) / "run")
        groups: list[list] = []
        collect = trainer.rollout.collect

        def recorded():
            got = collect()
            groups.append([[g.index, [list(s.response_ids) for s in g.samples]] for g in got])
            return got

        trainer.rollout.collect = recorded
        trainer.run()
        return {"trace": timing_free(trainer.trace.events), "groups": groups}


def run_modes() -> dict[str, dict[str, list]]:
    return {mode: run_mode(mode, None) for mode in MODES}


# Every mode at workers=1; one with no worker count (the default), each run ~1 s on a loaded 2-core machine.
RUNS = [(mode, 1) for mode in MODES] + [("sorted-partial", None)]


@pytest.mark.parametrize(("mode", "workers"), RUNS, ids=[f"{m}-{w or 'no-flag'}" for m, w in RUNS])
def test_one_worker_gives_the_trace_of_before_multiple_engines(mode, workers, one_thread):
    golden = json.loads(GOLDEN.read_text())["runs"][mode]
    assert any(e[0] == "decode" for e in golden["trace"] if isinstance(e, list))
    assert any(e["kind"] == "sequence" for e in golden["trace"] if isinstance(e, dict))
    assert len(golden["groups"]) == 2 and all(s for step in golden["groups"] for _, g in step for s in g)
    assert run_mode(mode, workers) == golden


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # as the test runs: the float sums, hence the sampled tokens, stay the same
    made = "python tests/test_one_engine_golden.py, PYTHONPATH = a tree of commit 6e89c49"
    body = {"made_by": made, "runs": run_modes()}
    Path(sys.argv[1]).write_text(json.dumps(body, separators=(",", ":")) + "\n")
