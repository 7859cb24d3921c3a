"""The cluster simulator: engine arithmetic, workloads, cost model, policies, CLI errors and the report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import cli
from test_report import CHROMIUM, check_all_figures_drew, synthetic_trace

from reference_trainer.errors import UserError
from rlbench.simulate import engine, simulate, workload
from rlbench.simulate.cost import CostModel, fit_run, preset
from rlbench.simulate.modes import SIM_MODES, SimMode, parse_sim_modes, sim_mode
from rlbench.simulate.scheduler import simulate_mode, spec_rate

ROOT = Path(__file__).resolve().parents[1]


class UnitCost(CostModel):
    """Every forward costs 1 s: finish times are forward counts, easy to check by hand."""

    name = "unit"

    def decode(self, batch, ctx, q=1.0):
        return np.where(batch > 0, 1.0, 0.0)

    def prefill(self, n_seqs, tokens, tokens_sq):
        return np.where(n_seqs > 0, 1.0, 0.0)

    def riding(self, n_seqs, tokens, tokens_sq):
        return np.zeros_like(tokens)

    def update(self, tokens, workers):
        return 0.0

    def describe(self):
        return {"kind": "unit"}


def queues(lengths: list[list[int]], prompt: int = 4) -> engine.Queues:
    q = max(len(x) for x in lengths)
    tok = np.ones((len(lengths), q), dtype=np.int64)
    for w, row in enumerate(lengths):
        tok[w, : len(row)] = row
    return engine.Queues(
        tok, np.full(tok.shape, float(prompt)), np.ones(tok.shape), np.array([len(x) for x in lengths])
    )


def test_engine_continuous_batching_by_hand():
    # capacity 2, lengths 3, 5, 2: prefill both (t 0-1, first tokens), decode 2 -> seq0 done at 3;
    # seq2 rides in the next decode (3-4, its first token), decode 1 -> seq1 and seq2 done at 5
    res = engine.run(queues([[3, 5, 2]]), 2, UnitCost())
    assert res.finish_t[0].tolist() == [3.0, 5.0, 5.0]
    assert res.admit_t[0].tolist() == [0.0, 0.0, 3.0]
    busy, slot_time, forwards = res.rounds.upto(6.0)
    # slot-time: prefill 2x1, decode 2x2, decode with seq2 riding 2x1, decode 2x1
    assert slot_time[0] == 10.0 and busy[0] == 5.0 and forwards[0] == 4
    assert res.rounds.work(6.0)[0][0] == 5  # the forwards a trace counts: the prefill and 4 decodes
    assert res.rounds.upto(2.5)[2][0] == 1  # one of the two decode forwards of round 2 done by t = 2.5


def test_engine_prefill_token_limit():
    # 3 sequences of 10 prompt tokens, limit 20: the first prefill admits two; the third rides in the
    # first decode
    res = engine.run(queues([[2, 2, 2]], prompt=10), 4, UnitCost(), max_prefill_tokens=20)
    assert res.admit_t[0].tolist() == [0.0, 0.0, 1.0]


def test_workers_are_independent_and_vectorised_correctly():
    rng = np.random.default_rng(3)
    lengths = [rng.integers(1, 60, size=n).tolist() for n in (7, 1, 12, 5)]
    cost = preset("h100", "7b")
    together = engine.run(queues(lengths), 3, cost)
    for w, row in enumerate(lengths):
        alone = engine.run(queues([row]), 3, cost)
        assert np.allclose(alone.finish_t[0, : len(row)], together.finish_t[w, : len(row)])
        assert alone.end_t[0] == pytest.approx(together.end_t[w])


def test_roofline_is_memory_bound_at_small_batch_and_h200_is_faster():
    h100, h200 = preset("h100", "7b"), preset("h200", "7b")
    b, ctx = np.array([8.0, 8.0]), np.array([8 * 2000.0, 8 * 2000.0])
    t1 = h100.decode(b, ctx)[0]
    assert t1 == pytest.approx(h100.overhead + (15.24e9 + 57344 * 16000) / (3.35e12 * 0.8), rel=1e-3)
    assert h200.decode(b, ctx)[0] < t1
    # verifying 5 tokens per sequence is nearly free at batch 8, not at batch 512 (compute-bound)
    assert h100.decode(b, ctx, q=5)[0] / t1 < 1.05
    big = np.array([512.0])
    assert h100.decode(big, big * 2000, q=5)[0] / h100.decode(big, big * 2000)[0] > 1.5
    with pytest.raises(UserError, match="unknown GPU preset"):
        preset("a100", "7b")


def test_spec_rate():
    assert spec_rate(np.array([0.0]), 4)[0] == pytest.approx(1.0)
    assert spec_rate(np.array([0.5]), 2)[0] == pytest.approx(1.75)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_synthetic_rank_correlation_and_overlap():
    for rho in (0.0, 0.9):
        tr = workload.synthetic(
            steps=2, prompts=400, group_size=8, sigma=1.0, prompt_share=0.9, rank_corr=rho
        )
        step1 = tr.step == 1
        real = tr.response_tokens[step1].reshape(400, 8).mean(axis=1)
        pred = tr.predicted[step1].reshape(400, 8)[:, 0]
        assert abs(spearman(real, pred) - rho) < 0.15, rho
    assert abs(tr.acceptance.mean() - 0.8) < 0.02
    assert tr.response_tokens.max() <= 16384 and tr.response_tokens.min() >= 1


def test_length_trace_io_and_errors(tmp_path):
    tr = workload.synthetic(steps=2, prompts=3, group_size=2)
    path = workload.write(tr, tmp_path / "lengths.jsonl")
    back = workload.load(path)
    assert back.response_tokens.tolist() == tr.response_tokens.tolist()
    assert np.allclose(back.acceptance, tr.acceptance, atol=1e-3)
    with pytest.raises(UserError, match="no such trace file"):
        workload.load(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"step": 0}\nnot json\n')
    with pytest.raises(UserError, match="bad.jsonl:2: malformed JSON row"):
        workload.load(tmp_path / "bad.jsonl")
    (tmp_path / "short.jsonl").write_text('{"step": 0, "prompt_id": "a"}\n')
    with pytest.raises(UserError, match="lacks sample, prompt_tokens, response_tokens"):
        workload.load(tmp_path / "short.jsonl")
    for key, value in (("prompt_tokens", 10**400), ("step", 2**63), ("response_tokens", 2**40)):
        row = {"step": 0, "prompt_id": "a", "sample": 0, "prompt_tokens": 3, "response_tokens": 5, key: value}
        (tmp_path / "big.jsonl").write_text(json.dumps(row) + "\n")  # overflowed numpy's int64: a traceback
        with pytest.raises(UserError, match=f"line 1: {key} is"):
            workload.load(tmp_path / "big.jsonl")
    with pytest.raises(UserError, match="unknown mode 'fastest'; valid modes: baseline"):
        parse_sim_modes(["baseline", "fastest"])


def test_run_trace_conversion_and_history_predictions():
    events = synthetic_trace(n_prompts=3, group=2, workers=1, steps=2)
    events.append({"kind": "sequence", "step": 1, "id": "x", "prompt_id": "p0", "sample": 9,
                   "prompt_tokens": 5, "response_tokens": 3, "status": "aborted"})  # fmt: skip
    tr = workload.from_run_trace(events)
    assert len(tr) == 12 and tr.steps == [0, 1]  # the aborted partial is not a length
    pred = workload.fill_predictions(tr, 0.8)
    # prompts p0..p2 recur in step 1: predicted = their step-0 group mean
    for p in range(3):
        rows0 = (tr.step == 0) & (tr.prompt == p)
        rows1 = (tr.step == 1) & (tr.prompt == p)
        assert np.allclose(pred[rows1], tr.response_tokens[rows0].mean())


def heavy(steps: int = 3, prompts: int = 64) -> workload.LengthTrace:
    return workload.synthetic(steps=steps, prompts=prompts, group_size=8, mean_tokens=800, max_tokens=8000,
                              rank_corr=0.95, overlap=0.85, seed=1)  # fmt: skip


def run_policy(mode: str | SimMode, tr, workers: int = 1, capacity: int = 64, cost=None) -> dict:
    """A mode (by name, with its defaults) or a policy (a mode with options) over the whole trace."""
    cost = cost or preset("h100", "7b")
    pred = workload.fill_predictions(tr, 0.9)
    acc = np.where(np.isnan(tr.acceptance), 0.7, tr.acceptance)
    sim_mode = SIM_MODES[mode] if isinstance(mode, str) else mode
    return simulate_mode(sim_mode, tr, pred, acc, cost, workers, capacity, len(tr.steps))


def test_sortedrl_removes_bubbles_and_partial_wastes_only_stale_work():
    tr = heavy()
    base, srt, part = (run_policy(n, tr) for n in ("baseline", "sorted", "sorted-partial"))
    assert base["bubble_ratio"] > 0.2
    assert srt["bubble_ratio"] < base["bubble_ratio"] / 2 and part["bubble_ratio"] < base["bubble_ratio"] / 2
    assert srt["wasted_token_share"] > 0.05 and part["wasted_token_share"] < srt["wasted_token_share"] / 2
    # what partial mode throws away is work older than max_staleness (1), regenerated as the trainer does
    uncapped = run_policy(sim_mode("sorted-partial", {"max_staleness": 1000}), tr)
    assert uncapped["wasted_token_share"] == 0.0
    assert part["rollout_s"] < base["rollout_s"]
    assert all(s["trained_groups"] == 64 for s in part["steps"])  # every step trains B complete groups


def test_histospec_and_histopipe():
    tr = heavy(prompts=32)
    base = run_policy("baseline", tr, workers=8)
    spec = run_policy(sim_mode("rhyme", {"dispatch": "round-robin"}), tr, workers=8)  # HistoSpec alone
    assert spec["draft_len"] > 0 and spec["rollout_s"] < 0.8 * base["rollout_s"]
    # HistoPipe balances predicted work: its dispatch can only remove worker idle time, not add it
    pipe = run_policy("histopipe", tr, workers=8, capacity=8)
    rr = run_policy("baseline", tr, workers=8, capacity=8)
    assert pipe["worker_idle_share"] < rr["worker_idle_share"]
    assert pipe["rollout_s"] <= rr["rollout_s"] * 1.001


def test_calibration_recovers_a_known_cost():
    events = synthetic_trace(workers=1, steps=1)  # decode 10 ms, prefill 4 ms, 1 ms between forwards
    cost = fit_run(events)
    assert cost.decode(np.array([3.0]), np.array([100.0]))[0] == pytest.approx(0.01, abs=1e-4)
    assert 0.0007 < cost.gap <= 0.001  # the trace leaves 1 ms after decodes, none after prefills: a mean
    assert cost.prefill(np.array([2]), np.array([24.0]), np.array([0.0]))[0] == pytest.approx(0.004, abs=5e-4)
    # (this fake trace decodes right after each prefill, unlike the engine: bubble replay is checked on a
    # real run in test_simulate_validation.py)


def test_simulate_doc_has_speedups_against_baseline():
    doc = simulate(heavy(steps=2, prompts=16), preset("h200", "1.5b"), [1, 4], ["sorted", "rhyme"], 32)
    rows = {(r["policy"], r["workers"]): r for r in doc["results"]}
    assert set(rows) == {(p, w) for p in ("baseline", "sorted", "rhyme") for w in (1, 4)}
    assert rows[("baseline", 4)]["speedup"] == 1.0
    r = rows[("rhyme", 4)]
    assert r["speedup"] == pytest.approx(rows[("baseline", 4)]["step_time_s"] / r["step_time_s"])


def simulate_cli(*args: str) -> subprocess.CompletedProcess:
    return cli("simulate", *args)


def test_cli_bad_input_is_one_line(tmp_path):
    for args, msg in (
        (["--trace", str(tmp_path / "nope.jsonl")], "no such trace file"),
        (["--synthetic", "--gpu", "tpu"], "unknown GPU preset"),
        (["--synthetic", "--modes", "baseline,magic"], "unknown mode 'magic'"),
        (["--synthetic", "--modes", "sorted", "--mode-option", "max_attempts=2"], "cannot model option"),
        (["--synthetic", "--workers", "1,x"], "expected comma-separated integers"),
        (["--synthetic", "--trace", str(tmp_path / "t.jsonl")], "exactly one of --trace FILE or --synthetic"),
        (["--synthetic", "--calibrate", str(tmp_path / "MISSING")], "--calibrate"),  # was read after --out
    ):
        res = simulate_cli(*args, "--out", str(tmp_path / "o"))
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and msg in res.stderr, (args, res.stderr)
        assert not (tmp_path / "o").exists()  # refused before --out is claimed


def test_no_options_run_the_synthetic_workload_quickly_with_progress_and_the_asked_modes_first(tmp_path):
    from rlbench.simulate.config import DEFAULT_WORKERS, SYNTHETIC_WORKERS, SimConfig

    bare = SimConfig.from_cli(None, None, None)  # `rlbench simulate` as typed: a workload, not a refusal
    assert bare.synthetic and bare.workers == SYNTHETIC_WORKERS and max(bare.workers) < max(DEFAULT_WORKERS)
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    assert SimConfig.from_cli(None, None, None, trace=trace).workers == DEFAULT_WORKERS  # a trace: the sweep
    res = simulate_cli("--steps", "1", "--prompts", "4", "--group-size", "2", "--workers", "1,2",
                       "--modes", "sorted,rhyme", "--out", str(tmp_path / "o"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "no --trace: the synthetic heavy-tailed workload, 1 steps of 4 prompts x 2" in res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in said] == [f"[{n}/6" for n in range(1, 7)]  # each as it came
    rows = [line[7:].split()[0] for line in res.stdout.splitlines() if line.startswith("W=")]
    assert rows == ["sorted", "sorted", "rhyme", "rhyme", "baseline", "baseline"]  # asked first, in order


def test_validate_is_a_command_of_its_own(tmp_path):
    """`rlbench simulate validate RUN` replays a run's trace (here an imported length log's) on a cost model
    fitted to it; options given to `simulate` before the subcommand are refused, not ignored."""
    rows = [{"step": s, "group": g, "prompt_tokens": 10, "response_tokens": [4 + 9 * g, 30 - 7 * g, 12]}
            for s in range(2) for g in range(3)]  # fmt: skip
    (tmp_path / "lengths.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    assert cli("import", "lengths", str(tmp_path / "lengths.jsonl"), "--slots", "4", "--workers", "1",
               "--out", str(run)).returncode == 0  # fmt: skip
    res = simulate_cli("validate", str(run), "--out", str(tmp_path / "v"))
    assert res.returncode == 0, res.stderr
    [doc] = json.loads((tmp_path / "v" / "validation.json").read_text())["runs"]
    assert len(doc["steps"]) == 2 and doc["capacity"] == 4 and 0 < doc["measured_bubble"] < 1
    assert doc["simulated_bubble"] is not None
    res = simulate_cli("--out", str(tmp_path / "w"), "validate", str(run))
    assert res.returncode == 2 and "--out: give `simulate validate`'s options after its name" in res.stderr
    assert not (tmp_path / "w").exists()
    res = simulate_cli("validate", str(tmp_path / "nope"), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "no such run folder or trace file" in res.stderr
    assert not (tmp_path / "x").exists()


def test_cli_writes_json_and_report(tmp_path):
    res = simulate_cli("--synthetic", "--steps", "2", "--prompts", "16", "--group-size", "4",
                       "--workers", "1,4", "--modes", "sorted,histopipe", "--out", str(tmp_path))  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "simulate.json").read_text())
    assert len(doc["results"]) == 6 and doc["cluster"]["workers"] == [1, 4]
    page = (tmp_path / "report.html").read_text()
    assert page.count("<script type='text/javascript'>/**") == 1 and "histopipe" in page
    if CHROMIUM:
        assert check_all_figures_drew(tmp_path / "report.html", tmp_path) == 4


def test_an_oversubscription_past_the_machines_memory_is_one_line(tmp_path, monkeypatch):
    """What SortedRL's pool would hold is checked against the machine before any replay: the synthetic
    workload's with the settings, a trace's once it is read; the bound is the work asked for, not a cap."""
    from rlbench.simulate import config

    big = parse_sim_modes(["sorted+async:oversubscription=1000000"])
    with pytest.raises(UserError, match=r"1,024,000,000 samples\) outstanding per step, about 381.5 GiB"):
        config.check_outstanding(big, 128, 8)
    config.check_outstanding(parse_sim_modes(["sorted"]), 128, 8)  # the default's 2,048 samples fit
    monkeypatch.setattr(config, "machine_memory", lambda: 1 << 19)  # a 512 KiB machine: 1,310 samples
    res = simulate_cli("--synthetic", "--modes", "sorted", "--prompts", "128", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "mode sorted: oversubscription 2 keeps 256 groups (2,048 samples)" in res.stderr
    assert "this machine has 0.5 MiB of memory" in res.stderr and not (tmp_path / "o").exists()
    trace = tmp_path / "t.jsonl"
    rows = [{"step": 0, "prompt_id": p, "sample": i, "prompt_tokens": 4, "response_tokens": 5}
            for p in range(300) for i in range(4)]  # fmt: skip
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    res = simulate_cli("--trace", str(trace), "--modes", "sorted", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "keeps 600 groups (2,400 samples)" in res.stderr, res.stderr
    res = simulate_cli(
        "--trace", str(trace), "--modes", "baseline", "--workers", "1", "--out", str(tmp_path / "o")
    )
    assert res.returncode == 0, res.stderr
