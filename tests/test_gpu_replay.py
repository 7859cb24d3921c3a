"""The GPU cost model: calibration files (rlbench/simulate/calibration.py), a run's schedule replayed through
one (gpu_replay.py), and the simulator's measured presets reading the same files (cost.py `preset`)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, cli

from reference_trainer.engine.fingerprint import engine_fingerprint
from reference_trainer.errors import UserError
from reference_trainer.trace.schema import read_trace
from rlbench.report.compare_summary import summary_lines
from rlbench.report.replay_summary import comparison_lines, run_lines
from rlbench.simulate.calibration import (
    Calibration,
    find_calibration,
    fit_update,
    model_shape,
    packaged,
    read_calibration,
    with_sweeps,
    write_calibration,
)
from rlbench.simulate.cost import Measured, Roofline, preset
from rlbench.simulate.gpu_replay import GpuReplay, comparison, forward_s, forwards, replay

RESULTS = ROOT / "benchmarks" / "results" / "gpu" / "run-2026-11-26-h200-2a83ee8"
SHAPE = {
    "vocab_size": 99,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}  # fmt: skip  (conftest's tiny char model)
PROVENANCE = {"device": "test GPU", "driver": "0", "torch": "0", "commit": "abc", "date": "2026-01-01",
              "command": "made in a test"}  # fmt: skip


def calibration(**fields) -> Calibration:
    """A calibration of round numbers: decode 1 ms + 0.01 ms a row, verify 1.5x at width 4, prefill and
    update swept unless given."""
    base = dict(gpu="test", model="tiny", model_label="tiny", shape=SHAPE, provenance=PROVENANCE, context=64,
                decode={1: 1.01e-3, 101: 2.01e-3}, verify={1: {1: 1.0, 4: 1.5}})  # fmt: skip
    return with_sweeps(Calibration(**{**base, **fields}))


def engine(kind: str, step: int, t: float, dur: float, slots: dict, tokens: int, **extra) -> dict:
    return {"kind": kind, "step": step, "t_start": t, "t_end": t + dur, "active_slots": len(slots),
            "capacity": 8, "tokens": tokens, "worker": 0, "slots": slots, **extra}  # fmt: skip


def test_the_packaged_calibrations_hold_what_the_gpu_run_measured_and_sweep_the_rest() -> None:
    by_name = {c.name: c for c in packaged()}
    assert set(by_name) == {"h200-smollm2-135m", "h200-embedded"}
    smol, embedded = by_name["h200-smollm2-135m"], by_name["h200-embedded"]
    decode_step = json.loads((RESULTS / "decode_step.json").read_text())["rows"]
    assert {rows: 1e3 * s for rows, s in smol.decode.items()} == {
        **{r["batch"]: pytest.approx(r["step_ms"]["engine"]) for r in decode_step},
        256: pytest.approx(5.353),  # the log's: the JSON lost batch 256 (gpu_run.log)
    }
    verify = json.loads((RESULTS / "verify_cost.json").read_text())["models"][1]
    assert smol.verify[64][8] == pytest.approx(verify["relative"]["64x8"])
    for cal in (smol, embedded):
        assert cal.provenance["device"] == "NVIDIA H200" and cal.provenance["commit"].startswith("2a83ee8")
        assert cal.provenance["date"] == "2026-11-26" and "benchmarks.gpu" in cal.provenance["command"]
        assert "prefill" in cal.swept  # never timed on a GPU: swept, not given a value
    assert smol.measured_terms == ["decode", "verify"] and "update" in smol.swept
    assert embedded.measured_terms == ["decode", "verify", "update"]
    assert len(smol.sweep()) == len(smol.swept["prefill"]["values"]) * len(smol.swept["update"]["values"])


def test_the_simulators_h200_smollm2_preset_is_the_calibration_file_and_the_7b_one_a_roofline() -> None:
    cost = preset("h200", "smollm2-135m")
    smol = next(c for c in packaged() if c.name == "h200-smollm2-135m")
    assert isinstance(cost, Measured)
    assert cost.decode(np.array([64]), np.array([0.0]))[0] == pytest.approx(smol.decode[64])
    assert cost.decode(np.array([64]), np.array([0.0]), q=8)[0] == pytest.approx(
        smol.decode[64] * smol.verify[64][8]
    )
    described = cost.describe()
    assert described["kind"] == "measured" and described["calibration"]["name"] == "h200-smollm2-135m"
    assert set(described["assumed"]) == {"prefill", "update"}  # said, with the value taken
    assert (
        isinstance(preset("h200", "7b"), Roofline) and preset("h200", "7b").describe()["kind"] == "roofline"
    )
    with pytest.raises(UserError, match="measured: h200 x embedded, h200 x smollm2-135m"):
        preset("h100", "smollm2-135m")


def test_costs_interpolate_between_measured_points_and_extrapolate_beyond_them() -> None:
    cal = calibration(prefill={1: {10: 2e-3, 30: 4e-3}, 3: {10: 3e-3}})
    assert float(cal.decode_s(51)) == pytest.approx(1.51e-3)
    assert float(cal.decode_s(201)) == pytest.approx(3.01e-3)  # along the last segment
    assert float(cal.decode_s(0)) == pytest.approx(1.01e-3)  # held below the first
    assert float(cal.verify_s(1, 2.5)) == pytest.approx(1.01e-3 * 1.25)
    assert float(cal.admission_s(1, 20, {})) == pytest.approx(3e-3)
    assert float(cal.admission_s(2, 20, {})) == pytest.approx(2.5e-3)  # rows 1 and 3 at 10 tokens a row
    assert cal.beyond(201) and cal.beyond(1, tokens_per_row=40) and not cal.beyond(50, 4)


def test_every_forward_kind_costs_its_shape_with_fallbacks_for_traces_without_rows() -> None:
    """Old traces: decode rows = active slots, verify tokens = rows x (width + 1), a prefill's tokens = the
    prompts it newly put in slots. New ones: rows, input_tokens, and admissions riding in a decode."""
    cal = calibration()
    events = [
        {"kind": "sequence", "step": 0, "id": "a", "prompt_tokens": 7, "t_admit": 0.0, "t_finish": 1.0},
        {"kind": "sequence", "step": 0, "id": "b", "prompt_tokens": 9, "t_admit": 0.0, "t_finish": 1.0},
        engine("prefill", 0, 0.0, 0.1, {"0": "a", "1": "b"}, 2),
        engine("decode", 0, 0.2, 0.1, {"0": "a", "1": "b"}, 2),
        engine("verify", 0, 0.4, 0.1, {"0": "a", "1": "b"}, 5, width=3, drafted=6),
        engine("decode", 0, 0.6, 0.1, {"0": "a", "1": "b", "2": "c"}, 3, rows=3, input_tokens=12,
               prefill_rows=1, prefill_tokens=10),
    ]  # fmt: skip
    shapes = [(f.kind, f.rows, f.tokens, f.admitted_rows, f.admitted_tokens) for f in forwards(events)]
    assert shapes == [("prefill", 2, 16, 0, 0), ("decode", 2, 2, 0, 0), ("verify", 2, 8, 0, 0),
                      ("decode", 3, 12, 1, 10)]  # fmt: skip
    assumed = {"prefill": 0.004, "update": 1e-6}
    costs = [forward_s(cal, f, assumed) for f in forwards(events)]
    decode2 = 1.02e-3
    assert costs == pytest.approx([decode2 + 0.004, decode2, decode2 * 1.5, 1.03e-3 + 0.004])


def _run(steps: int, prefills: int, decodes: int, host: float, update_tokens: int) -> list[dict]:
    """A synthetic one-worker run: per step, its prefills and decode steps of 2 rows, `host` seconds of
    rollout outside them, an update of `update_tokens`, 0.1 s of reward."""
    events, t = [], 0.0
    for step in range(steps):
        start = t
        for n in range(prefills + decodes):
            kind = "prefill" if n < prefills else "decode"
            events.append(engine(kind, step, t, 0.01, {"0": f"s{step}-{n}", "1": "x"}, 2, rows=2,
                                 input_tokens=20 if kind == "prefill" else 2))  # fmt: skip
            t += 0.01
        t += host
        events.append({"kind": "rollout", "step": step, "t_start": start, "t_end": t})
        events.append({"kind": "reward", "step": step, "t_start": t, "t_end": t + 0.1})
        events.append({"kind": "update", "step": step, "t_start": t + 0.1, "t_end": t + 1.1,
                       "tokens": update_tokens})  # fmt: skip
        t += 1.1
    return events


def test_the_replay_counts_host_time_per_engine_step_and_sweeps_what_was_never_measured() -> None:
    cal = calibration()  # prefill, update and host work swept
    base, fewer = _run(2, 1, 10, 0.05, 1000), _run(2, 4, 5, 0.02, 500)
    doc = comparison({"baseline": replay(base, cal), "sorted": replay(fewer, cal)}, "baseline")
    decode2 = 1.02e-3
    point = next(
        p
        for p in doc["runs"]["baseline"]["points"]
        if p["assumed"] == {"prefill": 0.01, "update": 1e-4, "host": 0.001}
    )
    # 11 forwards, one admitting; host work 1 ms for each of its 11 engine steps (not the 0.05 s measured)
    assert point["rollout_s"] == pytest.approx(11 * decode2 + 0.01 + 11 * 0.001)
    assert point["step_s"] == pytest.approx(point["rollout_s"] + 1000 * 1e-4 + 0.1)
    assert doc["runs"]["sorted"]["per_step"] == {"prefill": 4, "decode": 5, "verify": 0, "admissions": 4}
    # sorted: 9 forwards against 11, its 4 admissions against one: even at 3a = 2 decodes (host work at 0)
    even = doc["break_even_prefill_s"]["sorted"]
    assert even == pytest.approx(2 * decode2 / 3, rel=1e-6)
    assert doc["break_even_prefill_s"]["baseline"] is None
    lines = comparison_lines(doc)
    assert lines[0].startswith("GPU replay (a model, not a measurement)") and "test GPU" in lines[0]
    assert "never measured, swept: prefill at 0 / 5 / 10 / 20 / 50 ms per admission beyond" in lines[1]
    assert "host at 0 / 0.5 / 1 / 2.5 ms of host work per engine step" in lines[1]
    assert f"(break-even {1e3 * even:.1f} ms per admission)" in lines[-1]


def test_replaying_a_run_through_its_own_forward_times_reproduces_its_rollout(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The replay's arithmetic against a real CPU run: a table built from the run's own measured forwards
    (mean seconds per shape; an admission riding in a decode step: its step less a decode step over its
    rows, plus one over the admitted rows) gives back the run's rollout time."""
    out = tmp_path / "run"
    res = cli("train", "--mode", "sorted", "--steps", "2", "--model", str(tiny_model_dir),
              "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "12", "--eval-every", "0",
              "--device", "cpu", "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    # The rollout's wall time outside its forwards (the replay's source without CPU seconds): what the
    # measured rollout holds, whatever this machine's load.
    events = [{k: v for k, v in e.items() if k != "host_cpu_s"} for e in read_trace(out / "trace.jsonl")]
    decode, prefill = defaultdict(list), defaultdict(list)
    for f in forwards(events):
        if f.kind == "decode" and not f.admitted_rows:
            decode[f.rows].append(f.seconds)
    own_decode = calibration(decode={r: statistics.mean(s) for r, s in decode.items()},
                             verify={r: {1: 1.0} for r in decode})  # fmt: skip
    for f in forwards(events):  # admissions: a prefill's own, or what riding in a decode step added to it
        if f.kind == "prefill":
            prefill[f.rows, f.tokens / f.rows].append(f.seconds)
        elif f.admitted_rows:
            beside = f.seconds - float(own_decode.decode_s(f.rows) - own_decode.decode_s(f.admitted_rows))
            prefill[f.admitted_rows, f.admitted_tokens / f.admitted_rows].append(beside)
    assert decode and prefill  # sorted admits (in prefills, or riding in decode steps) and decodes the rest
    table: dict[int, dict[float, float]] = defaultdict(dict)
    for (rows, per_row), seconds in prefill.items():
        table[rows][per_row] = statistics.mean(seconds)
    own = replace(own_decode, prefill=dict(table), update={"s_fixed": 0.0, "s_per_token": 1e-6, "points": []})
    run = replay(events, own)
    assert run.source == "swept"
    measured = statistics.mean(s.measured_rollout_s for s in run.steps)
    # the run's host work as one rate per engine step: its wall time outside the forwards over its steps
    outside = sum(s.measured_rollout_s for s in run.steps) - sum(f.seconds for f in forwards(events))
    rate = outside / sum(s.engine_steps for s in run.steps)
    assert len(run.steps) == 2 and run.rollout_s({"host": rate}) == pytest.approx(measured, rel=0.05)


def _with_cpu(events: list[dict], parts: dict[str, float]) -> list[dict]:
    """The run with each rollout phase's CPU seconds by host part (as InlineRollout records them)."""
    return [{**e, "host_cpu_s": parts} if e["kind"] == "rollout" else e for e in events]


def test_the_replay_takes_host_time_from_the_calibration_or_a_sweep_never_from_this_machine() -> None:
    """The replayed figure is a function of the run's counts and the calibration: the same whatever host
    seconds this machine's load gave the run (wall or CPU, 1x or 10x), which are shown beside it."""
    parts = {"engine": 0.004, "controller": 0.003, "sampling": 0.001}
    wall, cpu = _run(2, 1, 10, 0.05, 1000), _with_cpu(_run(2, 1, 10, 0.05, 1000), parts)
    loaded = _with_cpu(_run(2, 1, 10, 0.5, 1000), {k: 10 * v for k, v in parts.items()})
    runs = [replay(events, calibration()) for events in (wall, cpu, loaded)]
    assert {r.source for r in runs} == {"swept"}
    assert runs[0].doc()["points"] == runs[1].doc()["points"] == runs[2].doc()["points"]
    forwards_s = runs[1].rollout_s({"prefill": 0.0, "update": 1e-4, "host": 0.0})
    assert runs[1].rollout_s({"prefill": 0.0, "update": 1e-4, "host": 0.001}) == pytest.approx(
        forwards_s + 11 * 0.001
    )
    host = runs[1].doc()["host"]
    assert host["this_cpu_s_by_part"] == pytest.approx(parts)
    assert host["this_cpu_s_per_engine_step"] == pytest.approx(0.008 / 11)
    assert host["s_per_rl_step_range"] == pytest.approx([0.0, 11 * 0.0025])
    assert runs[0].doc()["host"]["this_cpu_s_by_part"] is None  # a trace without CPU seconds
    per_step = calibration(host={"s_per_step": 2e-4, "controller_s_per_step": {"sorted": 1e-4}})
    run = replay(cpu, per_step, "sorted")  # measured per engine step on the GPU machine, the mode's too
    assert run.source == "calibration" and "host" not in run.sweep()[0]
    assert run.rollout_s({"prefill": 0.0, "update": 1e-4}) == pytest.approx(forwards_s + 11 * 3e-4)
    base = replay(wall, per_step, "baseline")  # no controller cost measured for it: the engine's only
    assert base.rollout_s({"prefill": 0.0, "update": 1e-4}) == pytest.approx(forwards_s + 11 * 2e-4)
    steps = calibration(decode_scope="engine_step", host={"s_per_step": 2e-4})  # in its decode costs
    assert replay(cpu, steps).rollout_s({"prefill": 0.0, "update": 1e-4}) == pytest.approx(forwards_s)
    lines = comparison_lines(comparison({"baseline": base, "sorted": run}, "baseline"))
    assert "as the calibration measured it on its GPU machine" in lines[2]
    swept = comparison_lines(comparison({"baseline": runs[0], "sorted": runs[1]}, "baseline"))
    assert "a host cost per engine step, swept" in swept[3] and "this CPU's, not in it: 0.73 ms" in swept[3]


def test_fit_update_is_a_line_or_the_pooled_rate_when_noise_makes_it_unphysical() -> None:
    line = fit_update([(1000, 1.1), (2000, 1.2), (3000, 1.3)])
    assert line["s_fixed"] == pytest.approx(1.0) and line["s_per_token"] == pytest.approx(1e-4)
    pooled = fit_update([(1000, 2.0), (2000, 1.0)])  # a falling line: noise
    assert pooled["s_fixed"] == 0.0 and pooled["s_per_token"] == pytest.approx(3.0 / 3000)


def test_a_calibration_is_found_by_its_model_shape_and_a_wrong_one_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert model_shape(tiny_model_dir) == SHAPE
    assert find_calibration(SHAPE) is None  # nothing packaged for the tiny model
    mine = write_calibration(tmp_path, calibration())
    assert find_calibration(SHAPE, tmp_path).name == "test-tiny" and find_calibration(SHAPE, mine) is not None
    smol = next(Path(p) for p in (ROOT / "rlbench" / "simulate" / "calibrations").glob("h200-smollm2*"))
    with pytest.raises(UserError, match="not of this run's model's shape"):
        find_calibration(SHAPE, smol)
    replayer = GpuReplay.for_model(tiny_model_dir)
    assert replayer.calibration is None
    said = run_lines(replayer.run_doc([]))
    assert said == [f"GPU replay: none ({replayer.run_doc([])['why']})"] and "h200-embedded" in said[0]
    broken = tmp_path / "broken" / "x.json"
    broken.parent.mkdir()
    broken.write_text(json.dumps({**calibration().to_json(), "decode": {"1": -1}}))
    with pytest.raises(UserError, match="decode holds a count below 1 or a value that is not a positive"):
        read_calibration(broken)
    # JSON's Infinity and 10^400 (no float) are not costs: refused at the reader, never `step inf s`
    for bad in ('{"1": Infinity}', '{"1": 1' + "0" * 400 + "}"):
        broken.write_text(json.dumps(calibration().to_json())[:-1] + f', "decode": {bad}}}')
        with pytest.raises(UserError, match="decode holds a count below 1 or a value that is not a positive"):
            read_calibration(broken)
    update = {**calibration().to_json(), "update": {"s_fixed": 0.0, "s_per_token": float("inf")}}
    broken.write_text(json.dumps(update))
    with pytest.raises(UserError, match="update needs s_fixed and s_per_token"):
        read_calibration(broken)


def test_compare_prints_the_replay_beside_the_measured_times_and_not_the_old_split(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    mine = write_calibration(tmp_path / "cal", calibration())
    out = tmp_path / "cmp"
    res = cli("compare", "--modes", "baseline,sorted", "--steps", "1", "--model", str(tiny_model_dir),
              "--prompts-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-every", "0",
              "--device", "cpu", "--calibration", str(mine), "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "GPU replay (a model, not a measurement)" in res.stdout and "At that split" not in res.stdout
    doc = json.loads((out / "compare.json").read_text())
    assert "gpu_split_model" not in doc and set(doc["gpu_replay"]["runs"]) == {"baseline", "sorted"}
    assert doc["gpu_replay"]["calibration"]["name"] == "test-tiny"
    assert summary_lines(doc)[-len(comparison_lines(doc["gpu_replay"])) :] == comparison_lines(
        doc["gpu_replay"]
    )
    metrics = json.loads((out / "sorted" / "metrics.json").read_text())
    assert metrics["gpu_replay"]["points"] and metrics["gpu_replay"]["calibration"]["name"] == "test-tiny"
    for page in (out / "report.html", out / "sorted" / "report.html"):
        assert "GPU replay (a model, not a measurement)" in page.read_text()
    smol = ROOT / "rlbench" / "simulate" / "calibrations" / "h200-smollm2-135m.json"
    wrong = cli("compare", "--modes", "baseline", "--model", str(tiny_model_dir), "--calibration", str(smol),
                "--out", str(tmp_path / "wrong"))  # fmt: skip
    assert_one_line_error(wrong, "not of this run's model's shape")


@pytest.mark.parametrize(("file", "saved_replay", "message"), [
    ("compare.json", [1], "gpu_replay is not an object"),
    ("compare.json", {"calibration": {"name": "x"}}, "calibration does not name its file, model, device"),
    ("metrics.json", {"calibration": {**calibration().describe()}, "points": 3},
     "gpu_replay's run lacks its points"),
])  # fmt: skip
def test_a_saved_replay_of_the_wrong_shape_is_one_line(tmp_path: Path, file: str, saved_replay: object,
                                                      message: str) -> None:  # fmt: skip
    saved = tmp_path / "saved"
    saved.mkdir()
    doc = {"run": {}, "summary": {}, "steps": [], "gpu_replay": saved_replay}
    if file == "compare.json":
        doc = {"baseline": "baseline", "runs": [{"mode": "baseline", "summary": {}, "steps": []}],
               "gpu_replay": saved_replay}  # fmt: skip
    (saved / file).write_text(json.dumps(doc))
    assert_one_line_error(cli("report", str(saved), tmp=tmp_path), message)


def test_a_calibration_from_another_engine_says_it_was_measured_on_an_older_engine() -> None:
    here = calibration(provenance={**PROVENANCE, "engine": engine_fingerprint()})
    assert not here.describe()["older_engine"]
    doc = comparison({"baseline": replay(_run(1, 1, 4, 0.01, 100), here)}, "baseline")
    assert "older engine" not in comparison_lines(doc)[0]
    for provenance in ({**PROVENANCE, "engine": "0123456789ab"}, PROVENANCE):  # another; none recorded
        other = calibration(provenance=provenance)
        line = comparison_lines(
            comparison({"baseline": replay(_run(1, 1, 4, 0.01, 100), other)}, "baseline")
        )[0]
        assert f"measured on an older engine (engine {provenance.get('engine', 'not recorded')}, " in line
        assert f"replayed on {engine_fingerprint()})" in line


def test_the_step_figure_carries_the_update_fits_residuals_as_a_range() -> None:
    points = [[1000.0, 1.0], [2000.0, 1.4], [3000.0, 1.2]]  # a line through noise
    fit = fit_update(points)
    cal = calibration(update=fit)
    residual = cal.update_residual_s()
    line = [fit["s_fixed"] + fit["s_per_token"] * t for t, _ in points]
    assert residual == pytest.approx(
        float(np.sqrt(np.mean([(s - f) ** 2 for (_, s), f in zip(points, line, strict=True)])))
    )
    run = replay(_run(2, 1, 10, 0.05, 1000), cal)
    assert sorted({p["update_residual"] for p in run.sweep()}) == pytest.approx([-residual, 0.0, residual])
    at = {"prefill": 0.0, "host": 0.0}
    low, mid = run.step_s({**at, "update_residual": -residual}), run.step_s({**at, "update_residual": 0.0})
    assert mid - low == pytest.approx(residual) and run.rollout_s(at) == run.rollout_s(
        {**at, "update_residual": 1}
    )
    assert calibration(update={**fit, "points": points[:2]}).update_residual_s() is None  # too few to judge
