"""HistoSpec's cost gate: the decision as a function of the cost table, the acceptance and the batch, and a
cost table measured through the forward path the engine's steps take (graphs on CUDA, eager on CPU)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from benchmarks.gpu import SMOLLM2_SHAPE
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.speculation.cost import ForwardCosts, expected_tokens, measure_cost_model, verify_width

MARGIN = 0.05  # the Speculator's default


def table(ratios: dict[int, float], batches: tuple[int, ...] = (1, 16, 64)) -> ForwardCosts:
    """A cost table whose verify of width w costs ratios[w] decode steps at every batch."""
    return ForwardCosts({(b, w): 1e-3 * r for b in batches for w, r in ratios.items()})


# Verify widths 1..17 cost 1.00-1.04 decode steps: the shape a GPU's memory-bound forward has under graphs.
ABOUT_ONE = table({1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.04, 17: 1.04})


@pytest.mark.parametrize("alpha", [0.05, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("drafting_rows", [1, 4, 64])
def test_a_verify_that_costs_about_one_decode_step_keeps_drafting_on(alpha, drafting_rows) -> None:
    """At batch 64 with few rows drafting, one verify adds a fraction of a token per row. Before, the gate
    asked for 5% more tokens than a decode step even when the verify cost the same, so it switched drafting
    off (one row drafting 4 tokens at alpha 0.5 adds 0.94 tokens to 64: 1.5%)."""
    drafts = [4] * drafting_rows + [0] * (64 - drafting_rows)
    q = verify_width(ABOUT_ONE, drafts, alpha, MARGIN)
    assert q > 0
    assert expected_tokens(drafts, q, alpha) > 64  # it verifies because it expects a gain


def test_the_gate_still_refuses_a_verify_that_costs_more_than_it_gains() -> None:
    drafts = [4] * 4 + [0] * 60
    costly = table({1: 1.0, 2: 1.5, 4: 1.6, 8: 1.8, 17: 2.5})  # a CPU's compute-bound verify
    assert verify_width(costly, drafts, 0.9, MARGIN) == 0  # 4 rows gain < 4 tokens of 64: not 50% more
    assert verify_width(costly, [8] * 64, 0.9, MARGIN) > 0  # every row drafting at 90%: it pays
    assert verify_width(ABOUT_ONE, drafts, 0.0, MARGIN) == 0  # nothing can be accepted: no gain
    assert verify_width(ABOUT_ONE, [0] * 64, 0.9, MARGIN) == 0  # nothing to verify
    # Just above the margin the old rule holds: the gain must beat the cost ratio by the margin.
    above = table({1: 1.0, 2: 1.06, 4: 1.06, 17: 1.06})
    assert verify_width(above, [1] * 64, 0.1, MARGIN) == 0  # 10% more tokens for 6% more time: < 1.06 * 1.05
    assert verify_width(above, [1] * 64, 0.2, MARGIN) == 1  # 20% more tokens: pays


def test_corrections_from_observed_steps_move_the_gate() -> None:
    """A verify step observed at 1.5x its table entry (host work the table misses) is no longer free."""
    drafts = [4] * 4 + [0] * 60
    assert verify_width(ABOUT_ONE, drafts, 0.5, MARGIN, decode_correction=1.0, verify_correction=1.5) == 0
    assert verify_width(ABOUT_ONE, drafts, 0.5, MARGIN, decode_correction=1.5, verify_correction=1.5) > 0


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    torch.manual_seed(0)
    cfg = tiny_config(32)
    return DecoderLM(cfg).eval()


@pytest.mark.parametrize("static", [False, True])
def test_the_cost_table_is_timed_through_the_runner_steps(model, static, monkeypatch) -> None:
    """Each cell runs the runner's decode (q = 1) or extend (q > 1) over probe sequences of the cell's batch;
    with the static (graph) path attached every forward goes through it, as the engine's steps do. The probes
    leave no trace: their slots are free again and seeded outputs are unchanged."""
    params = [SamplingParams(max_tokens=10, seed=s, ignore_eos=True) for s in range(4)]
    expected = [
        s.response_ids for s in Engine(model, EngineConfig(max_num_seqs=8)).generate([[5, 6]] * 4, params)
    ]
    engine = Engine(model, EngineConfig(max_num_seqs=8, max_model_len=96))
    if static:  # the graph path's static shapes, run eagerly (no CUDA here)
        engine.runner.static = StaticForward(
            model, engine.slots, engine.config.max_verify_tokens, capture=False
        )
    calls: list[tuple[str, int, int]] = []
    for name in ("decode", "extend"):
        original = getattr(engine.runner, name)

        def spy(seqs, *rows, _name=name, _original=original):  # type: ignore[no-untyped-def]
            calls.append((_name, len(seqs), len(rows[0][0]) if rows else 1))
            return _original(seqs, *rows)

        monkeypatch.setattr(engine.runner, name, spy)
    static_runs = []
    if static:
        run = engine.runner.static.run
        monkeypatch.setattr(
            engine.runner.static, "run", lambda rows, *a: static_runs.append(len(rows)) or run(rows, *a)
        )
    cost = measure_cost_model(engine, batches=(1, 8), qs=(1, 4), context=40, repeats=2)
    assert set(cost.table) == {(1, 1), (1, 4), (8, 1), (8, 4)}
    cells = [(kind, b, q) for b in (1, 8) for kind, q in (("decode", 1), ("extend", 4))]
    assert calls == [cell for cell in cells for _ in range(3)]  # a warm-up and 2 timed runs each
    assert static_runs == ([b for _, b, _ in calls] if static else [])
    assert engine.slots.num_free == 8
    monkeypatch.undo()
    assert [s.response_ids for s in engine.generate([[5, 6]] * 4, params)] == expected


@pytest.mark.gpu
def test_under_cuda_graphs_a_verify_of_up_to_8_tokens_costs_at_most_1_5_decode_steps_at_batch_64() -> None:
    torch.manual_seed(0)
    model = DecoderLM(SMOLLM2_SHAPE).to("cuda", torch.bfloat16)
    engine = Engine(model, EngineConfig(max_num_seqs=64, max_model_len=1024, device="cuda"))
    assert engine.runner.static is not None and engine.runner.static.capture
    widths = (1, 2, 3, 5, 9)  # a decode step; verifies of 1, 2, 4 and 8 draft tokens
    cost = measure_cost_model(engine, batches=(64,), qs=widths, context=256, repeats=5)
    assert engine.runner.static.graphs  # the table timed graph replays
    ratios = {w - 1: cost.table[64, w] / cost.table[64, 1] for w in widths[1:]}
    assert all(r <= 1.5 for r in ratios.values()), ratios
