"""`rlbench reproduce`: every spec names its runner, the verdict rule, result.json and its page, the index,
and one-line errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli, write_tiny_char_model

from reference_trainer.errors import UserError
from reference_trainer.trace.records import read_json, write_json
from reference_trainer.trace.schema import FORWARD_KINDS
from rlbench.reproduce import runner as runner_module
from rlbench.reproduce.base import Context, Outcome
from rlbench.reproduce.index import index_text
from rlbench.reproduce.runner import reproduce, runnable_here
from rlbench.reproduce.spec import load_specs, parse_spec

SPEC = """
runner = "test_reproduce:fake_runner"
claim = "X halves Y."
source = "Paper, arXiv 0000.00000, Table 1"
paper_value = "50%"
workload = "a toy"
metric = "y"

[verdict]
rule = "Reproduced when y falls by half or more, given a baseline y of at least 0.3."
requires = [{ metric = "y.baseline", op = ">=", value = 0.3 }]
checks = [{ metric = "y_vs_baseline.x", op = "<=", value = 0.5 }]
"""


def test_every_spec_names_a_runner_that_imports():
    for spec in load_specs().values():
        assert callable(spec.run_function()), spec.name


def test_the_verdict_follows_the_rule():
    spec = parse_spec("toy", SPEC)
    assert spec.verdict(None) == ("not run", [])
    assert spec.verdict({"y.baseline": 0.6, "y_vs_baseline.x": 0.4})[0] == "reproduced"
    verdict, reasons = spec.verdict({"y.baseline": 0.6, "y_vs_baseline.x": 0.7})
    assert verdict == "not reproduced"
    assert reasons == ["precondition y.baseline >= 0.3: holds (0.6)", "y_vs_baseline.x <= 0.5: fails (0.7)"]
    # a failed precondition, or a metric the run did not measure, decides nothing
    assert spec.verdict({"y.baseline": 0.1, "y_vs_baseline.x": 0.4})[0] == "inconclusive"
    assert spec.verdict({"y.baseline": 0.6, "y_vs_baseline.x": None})[0] == "inconclusive"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (SPEC.replace('op = "<="', 'op = "=="'), "op must be one of"),
        (SPEC.replace('claim = "X halves Y."', ""), "lacks claim"),
        (SPEC.replace('rule = "Reproduced', 'rules = "Reproduced'), "lacks verdict.rule"),
        (SPEC.replace('metric = "y"', 'modes = ["baseline", "x"]\nmetric = "y"'), "unknown key 'modes'"),
    ],
)
def test_a_malformed_spec_is_refused_with_its_path(text, error):
    with pytest.raises(ValueError, match=error) as err:
        parse_spec("toy", text)
    assert "rlbench/reproduce/specs/toy.toml" in str(err.value)


def fake_runner(ctx: Context) -> Outcome:
    return Outcome(
        measured={"headline": "0.6 → 0.2", "y.baseline": 0.6, "y_vs_baseline.x": 1 / 3},
        config={"quick": ctx.quick},
        seeds=[ctx.seed],
        sections=[("Plot", ["<p>a part</p>"])],
        notes=["a caveat"],
        data={"raw": [1, 2]},
    )


def test_a_run_writes_result_json_and_a_page_and_the_index_reads_them(tmp_path):
    spec = parse_spec("toy", SPEC)
    result = reproduce("toy", spec, tmp_path, device="cpu", quick=False, model=None)
    saved = read_json(tmp_path / "toy" / "cpu" / "result.json")
    assert saved == result
    assert saved["verdict"] == "reproduced"
    assert saved["claim"] == {"source": spec.source, "text": spec.claim, "value": "50%"}
    for key in ("name", "measured", "device", "torch", "commit", "config", "seeds", "wall_s", "data"):
        assert key in saved
    assert saved["command"] == "rlbench reproduce toy"
    page = (tmp_path / "toy" / "cpu" / "report.html").read_text()
    assert "X halves Y." in page and "a caveat" in page and "a part" in page and "reproduced" in page
    index = index_text({"toy": spec}, tmp_path)
    row = next(line for line in index.splitlines() if line.startswith("| **[toy]("))
    assert "[0.6 → 0.2](toy/cpu/report.html) (reproduced)" in row
    assert "| not run |" in row  # no GPU result
    # a GPU result, where one exists, decides the index's verdict
    gpu = {**saved, "measured": {**saved["measured"], "y_vs_baseline.x": 0.9}}
    (tmp_path / "toy" / "gpu").mkdir()
    write_json(tmp_path / "toy" / "gpu" / "result.json", gpu)
    row = next(
        line for line in index_text({"toy": spec}, tmp_path).splitlines() if line.startswith("| **[toy](")
    )
    assert "| not reproduced |" in row


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("reproduce",), "name reproductions or give --all"),
        (("reproduce", "sortedrl-bubble", "--all"), "name reproductions or give --all"),
        (("reproduce", "no-such-claim"), "no reproduction named 'no-such-claim'"),
        (("reproduce", "--all", "--device", "tpu"), "--device must be auto, cpu or cuda"),
    ],
)
def test_bad_input_is_one_line(args, text, tmp_path):
    assert_one_line_error(cli(*args, tmp=tmp_path), text)


def test_list_names_every_reproduction_in_lines_a_terminal_shows(tmp_path):
    res = cli("reproduce", "--list", tmp=tmp_path)
    assert res.returncode == 0
    names = [line for line in res.stdout.splitlines() if not line.startswith(" ")]
    assert names == list(load_specs())
    assert max(len(line) for line in res.stdout.splitlines()) <= 100


@pytest.mark.e2e
def test_sortedrl_bubble_quick_end_to_end_and_resumed(tmp_path, monkeypatch):
    """The quick run through the CLI, on a tiny model at 16 slots (CI's `rlbench reproduce --all --quick`
    runs the quick size): three modes trained, the bubble read from their traces; a second invocation
    reuses the finished runs instead of training again."""
    from reference_trainer.trace import metrics
    from reference_trainer.trace.records import read_jsonl
    from rlbench.reproduce.sortedrl import Workload

    model = write_tiny_char_model(tmp_path / "model", eos_weight=1.0)  # lengths vary: a tail to remove
    small = Workload(steps=2, prompts_per_step=4, group_size=4, max_tokens=48, seeds=1)
    monkeypatch.setattr(Workload, "for_context", classmethod(lambda cls, ctx: small))
    args = ("reproduce", "sortedrl-bubble", "--quick", "--model", str(model), "--out", str(tmp_path / "out"))
    res = cli(*args, tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    result = read_json(tmp_path / "out" / "sortedrl-bubble" / "cpu" / "result.json")
    m = result["measured"]
    assert result["quick"] is True and result["config"]["steps"] == 2
    assert m["bubble_ratio_vs_baseline.sorted"] == pytest.approx(
        m["bubble_ratio.sorted"] / m["bubble_ratio.baseline"]
    )
    # the traces are the source: the baseline's bubble recomputed from its own, and SortedRL's slots fuller
    # than the baseline's in work (occupied slot-steps per forward: no clock, so no machine load, in it)
    traces = {mode: read_jsonl(tmp_path / "out" / "sortedrl-bubble" / "cpu" / "work" / "seed0" / mode /
                               "trace.jsonl") for mode in ("baseline", "sorted")}  # fmt: skip
    assert metrics.compute(traces["baseline"])["summary"]["bubble_ratio"] == pytest.approx(
        m["bubble_ratio.baseline"]
    )
    forwards = {mode: [e for e in t if e["kind"] in FORWARD_KINDS] for mode, t in traces.items()}
    fill = {mode: sum(e["active_slots"] / e["capacity"] for e in f) / len(f) for mode, f in forwards.items()}
    assert fill["baseline"] < fill["sorted"], fill
    assert "sortedrl-bubble" in (tmp_path / "out" / "README.md").read_text()
    again = cli(*args, tmp=tmp_path)
    assert again.returncode == 0 and "reusing the finished runs" in again.stdout


def test_runs_of_another_commit_or_config_are_said_and_recomputed_never_mixed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner_module, "source_commit", lambda: "c0ffee")
    spec = parse_spec("toy", SPEC)
    work = tmp_path / "toy" / "cpu" / "work"
    reproduce("toy", spec, tmp_path, device="cpu", quick=False, model=None)
    (work / "modes.json").write_text("{}")  # a finished run a runner would reuse
    reproduce("toy", spec, tmp_path, device="cpu", quick=False, model=None)
    assert (work / "modes.json").is_file()  # same commit and config: kept
    monkeypatch.setattr(runner_module, "source_commit", lambda: "beef")
    reproduce("toy", spec, tmp_path, device="cpu", quick=False, model=None)
    out = capsys.readouterr().out
    assert "another commit or configuration (commit 'c0ffee' -> 'beef'); recomputing" in out
    assert not (work / "modes.json").exists()
    (work / "modes.json").write_text("{}")
    reproduce("toy", spec, tmp_path, device="cpu", quick=True, model=None)
    assert "quick False -> True" in capsys.readouterr().out and not (work / "modes.json").exists()


def test_the_readme_results_table_is_the_generated_index_of_the_committed_results(tmp_path):
    from pathlib import Path

    from rlbench.reproduce.index import readme_text, write_index

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    specs = load_specs()
    assert readme_text(readme, specs, root / "reports") == readme  # regenerate it: rlbench reproduce
    assert "[sortedrl-bubble](rlbench/reproduce/specs/sortedrl-bubble.toml)" in readme
    # write_index refreshes a project README's block next to the results folder, and nothing else in it
    block = "<!-- reproductions:begin -->\nstale\n<!-- reproductions:end -->"
    (tmp_path / "README.md").write_text(f"intro\n{block}\nend\n")
    (tmp_path / "reports").mkdir()
    write_index(specs, tmp_path / "reports")
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("intro\n") and text.endswith("end\n") and "stale" not in text
    assert "| [sortedrl-bubble](" in text and "rlbench/reproduce/specs/sortedrl-bubble.toml) | " in text
    assert "| not run | not run |" in text


def test_real_model_claims_name_their_model_and_need_a_gpu_under_all():
    specs = load_specs()
    real = [n for n, s in specs.items() if s.needs_gpu]
    assert set(real) == {n for n in specs if n.endswith("-smollm2")}
    assert all(specs[n].model == "smollm2-135m-instruct" for n in real)
    assert all(specs[n].model is None and not specs[n].needs_gpu for n in specs if n not in real)
    on_cpu, left_out = runnable_here(specs, list(specs), all_=True, device="cpu")
    assert left_out == real and not set(on_cpu) & set(real)
    assert runnable_here(specs, list(specs), all_=True, device="cuda") == (list(specs), [])
    assert runnable_here(specs, real[:1], all_=False, device="cpu") == (real[:1], [])  # named: it runs
    index = index_text(specs, Path("/nonexistent"))
    row = next(line for line in index.splitlines() if line.startswith(f"| **[{real[0]}]("))
    assert "| GPU only | not run |" in row


def test_a_spec_model_is_the_default_and_the_command_names_only_an_override(tmp_path):
    spec = replace(parse_spec("toy", SPEC), model="embedded")
    result = reproduce("toy", spec, tmp_path, device="cpu", quick=False, model=None)
    assert result["command"] == "rlbench reproduce toy"
    assert (tmp_path / "toy" / "cpu" / "work" / "origin.json").is_file()
    assert read_json(tmp_path / "toy" / "cpu" / "work" / "origin.json")["model"] == "embedded"
    other = reproduce("toy", spec, tmp_path / "o", device="cpu", quick=False, model="some-dir")
    assert other["command"] == "rlbench reproduce toy --model some-dir"


def test_a_plain_reproduce_writes_under_runs_and_only_update_reports_writes_reports(tmp_path):
    from rlbench.commands.reproduce import results_root

    assert results_root(None, False, False) == Path("runs/reproduce")
    assert results_root(None, True, False) == Path("runs/reproduce-quick")
    assert results_root(tmp_path, False, False) == tmp_path
    assert results_root(None, False, True) == Path("reports")
    for out, quick in ((tmp_path, False), (None, True)):
        with pytest.raises(UserError, match="--update-reports writes reports/"):
            results_root(out, quick, True)
