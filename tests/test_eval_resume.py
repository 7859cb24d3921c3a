"""Resume: a rerun never regenerates a finished problem, never fails on a torn line however often it is
killed, and reports exactly what one uninterrupted run reports (every summary field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_eval_runner import GOLDS, FakeBackend, _cfg, _tear_last_line, _write_suite, eval_plan

from reference_trainer.trace.records import read_jsonl
from rlbench.eval.pool import GradingPool
from rlbench.eval.runner import run_eval

TRUNCATED = {"fx-02", "fx-04"}  # problems whose prompt the backend cuts to fit its context


class CuttingBackend(FakeBackend):
    """FakeBackend that also reports, as the real backends do, which prompts it cut."""

    def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
        out = super().generate(prompts, params)
        self.last_truncated = [any(f"Problem {pid}:" in p for pid in TRUNCATED) for p in prompts]
        return out


@pytest.fixture(scope="module")
def pool():
    with GradingPool(workers=2) as p:
        yield p


def _run(out: Path, data: Path, pool: GradingPool, backend_factory) -> dict:
    return run_eval(eval_plan(_cfg(), data), backend_factory, out, pool=pool, chunk_seqs=2, progress=False)


def test_every_summary_field_survives_a_resume(tmp_path: Path, pool: GradingPool) -> None:
    data = _write_suite(tmp_path / "data")
    straight = _run(tmp_path / "straight", data, pool, CuttingBackend)
    assert straight["truncated_prompts"] == 2 * len(TRUNCATED)  # K=2 samples, each prompt cut

    out = tmp_path / "resumed"
    for fail_after in (1, 3, 2):  # killed mid-run three times, each time tearing the last row
        crashing = CuttingBackend(fail_after=fail_after)
        with pytest.raises(RuntimeError, match="simulated crash"):
            _run(out, data, pool, lambda b=crashing: b)
        _tear_last_line(out / "problems.jsonl")
    resumed = _run(out, data, pool, CuttingBackend)
    assert resumed == straight  # truncated_prompts used to drop to 0 here
    nothing_left = _run(out, data, pool, lambda: pytest.fail("nothing is left to generate"))
    assert nothing_left == straight
    assert json.loads((out / "results.json").read_text()) == straight


def test_reruns_over_torn_lines_never_regenerate_a_finished_problem(
    tmp_path: Path, pool: GradingPool, capsys: pytest.CaptureFixture
) -> None:
    data = _write_suite(tmp_path / "data")
    out = tmp_path / "out"
    progress = out / "problems.jsonl"
    # How much of the last row a kill leaves: one byte, half, all but its newline (a whole row survives).
    keep = [lambda n: 1, lambda n: n // 2, lambda n: n - 1]
    finished: list[str] = []
    for attempt in range(3 * len(GOLDS) + 1):
        backend = CuttingBackend(fail_after=1)  # one problem finishes, then the process "dies"
        try:
            _run(out, data, pool, lambda b=backend: b)
        except RuntimeError as err:
            assert "simulated crash" in str(err)  # never anything else: no torn line wedges a rerun
        else:
            break
        assert not set(backend.generated_ids) & set(finished), "a finished problem was generated again"
        raw = progress.read_bytes()
        start = raw.rstrip(b"\n").rfind(b"\n") + 1
        progress.write_bytes(raw[: start + keep[attempt % 3](len(raw) - start)])
        finished = [r["id"] for r in read_jsonl(progress)]
    else:
        pytest.fail("the eval never completed")
    assert set(backend.generated_ids) == set(GOLDS) - set(finished)
    lines = progress.read_bytes().split(b"\n")
    assert lines[-1] == b"" and sorted(json.loads(x)["id"] for x in lines[:-1]) == sorted(GOLDS)
    assert "cut a torn last line" in capsys.readouterr().err


class OneByOneBackend(FakeBackend):
    """Reports each response as it finishes (as the engine backends do), and is killed (Ctrl-C) after
    `stop_after` responses, in the middle of one generate call."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.stop_after, self.reported, self.rows_seen = stop_after, 0, []

    def generate(self, prompts: list[str], params: list, on_text=None) -> list[str]:
        out = super().generate(prompts, params)
        for i, text in enumerate(out):
            if self.stop_after is not None and self.reported == self.stop_after:
                raise KeyboardInterrupt
            on_text(i, text)
            self.reported += 1
            self.rows_seen.append(self.rows())
        return out

    def rows(self) -> int:
        path = self.out / "problems.jsonl"
        return len(read_jsonl(path)) if path.is_file() else 0


def test_each_problem_is_saved_when_its_last_sample_finishes(tmp_path: Path, pool: GradingPool) -> None:
    """One generate call holds every problem (chunk_seqs 64); a problem's row is written the moment its
    last sample is in, and a Ctrl-C in the middle of the call keeps every problem finished before it."""
    data = _write_suite(tmp_path / "data")
    straight = run_eval(
        eval_plan(_cfg(), data), FakeBackend, tmp_path / "straight", pool=pool, progress=False
    )
    out = tmp_path / "out"
    backend = OneByOneBackend(stop_after=5)  # K = 2: problems 1 and 2 complete, the third is half done
    backend.out = out
    with pytest.raises(KeyboardInterrupt):
        run_eval(eval_plan(_cfg(), data), lambda: backend, out, pool=pool, progress=False)
    assert backend.rows_seen == [0, 1, 1, 2, 2]  # a row per problem, as its second sample arrives
    assert [r["id"] for r in read_jsonl(out / "problems.jsonl")] == sorted(GOLDS)[:2]
    whole = OneByOneBackend()
    whole.out = out
    assert run_eval(eval_plan(_cfg(), data), lambda: whole, out, pool=pool, progress=False) == straight
    assert whole.reported == 2 * (len(GOLDS) - 2)  # only the unfinished problems were generated again
