"""The shipped embedded model: verified by SHA-256 on every load, rebuilt by its recipe, and the recipe's
lazy demonstrator behaving as documented."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reference_trainer.errors import ModelLoadError
from reference_trainer.model import embedded
from reference_trainer.model.loader import load_model
from rlbench.cli import app_


def test_the_shipped_model_is_small_verified_and_loads():
    directory = embedded.default_model_dir()
    size = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    assert size <= 8 * 2**20
    model = load_model(directory)
    assert model.config.vocab_size == 99


@pytest.fixture
def corrupted(tmp_path, monkeypatch) -> Path:
    copy = tmp_path / "weights"
    shutil.copytree(embedded.shipped_dir(), copy)
    raw = bytearray((copy / "model.safetensors").read_bytes())
    raw[-1] ^= 0xFF  # one flipped bit pattern in the last weight
    (copy / "model.safetensors").write_bytes(bytes(raw))
    monkeypatch.setattr(embedded, "shipped_dir", lambda: copy)
    return copy


def test_a_corrupted_weight_file_is_an_error_naming_it(corrupted):
    with pytest.raises(ModelLoadError, match=r"model\.safetensors does not match its SHA-256"):
        embedded.default_model_dir()
    (corrupted / "SHA256SUMS").unlink()
    with pytest.raises(ModelLoadError, match="SHA256SUMS is missing"):
        embedded.default_model_dir()


def test_the_cli_refuses_a_corrupted_model_in_one_line(corrupted, tmp_path, monkeypatch, capsys):
    from rlbench.cli import app

    monkeypatch.setattr("sys.argv", ["rlbench", "train", "--steps", "1", "--out", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exc:
        app()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "model.safetensors" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no training on a model that failed its check


def test_embedded_build_makes_a_loadable_verified_model(tmp_path):
    out = tmp_path / "built"
    res = CliRunner().invoke(app_, ["embedded", "build", "--steps", "2", "--no-card", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "SFT step 2/2, loss" in res.output  # progress lines when the output is not a terminal
    assert embedded.verify(out) == out
    model = load_model(out)
    assert model.config == load_model(embedded.shipped_dir()).config  # the recipe's architecture
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built"]  # no temp directory left beside it
    (tmp_path / "notes.txt").write_text("mine")
    res = CliRunner().invoke(
        app_, ["embedded", "build", "--steps", "1", "--no-card", "--out", str(tmp_path / "notes.txt")]
    )
    assert res.exit_code != 0 and "not a model directory" in str(res.exception)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_shipped_card_is_the_recipes_and_meets_its_targets():
    from reference_trainer.tasks import RUN_TASK_OPTIONS
    from reference_trainer.trace.records import read_json
    from reference_trainer.train.recipe import RECIPE_VERSION, card_misses

    card = read_json(embedded.shipped_dir() / embedded.CARD)
    assert card["recipe_version"] == RECIPE_VERSION  # weights rebuilt whenever the recipe changes
    assert set(card["tasks"]) == set(RUN_TASK_OPTIONS)
    assert card_misses(card["tasks"]) == []


def test_card_misses_names_each_missed_target():
    from reference_trainer.train.recipe import card_misses

    good = {
        "greedy_acc": 0.3,
        "pass1_t1": 0.2,
        "pass8_t1": 0.6,
        "len_p99_over_p50": 9.0,
        "median_top_prob": 0.99,
    }
    assert card_misses({"arith": good, "kk": good}) == []
    bad = {**good, "greedy_acc": 0.1, "pass8_t1": 0.3, "len_p99_over_p50": 2.0}
    misses = card_misses({"arith": bad, "kk": good})
    assert len(misses) == 3 and all(m.startswith("arith") for m in misses)
    assert "greedy_acc 0.100" in misses[0]


def test_the_lazy_demonstrator_guesses_more_on_larger_problems():
    from reference_trainer.tasks import get_task
    from reference_trainer.train.recipe import RECIPE, guess_response, lazy_share

    arith, kk = get_task("arith"), get_task("kk", num_people=(2, 3))
    shares = {}
    for p in arith.problems(400, seed=5):
        shares.setdefault(p.meta["num_ops"], lazy_share(RECIPE, "arith", p))
    assert shares[2] < shares[4] < shares[6] <= shares[max(shares)] <= 0.8
    rng = random.Random(0)
    for task, name in ((arith, "arith"), (kk, "kk")):
        problems = task.problems(200, seed=6)
        guesses = [guess_response(name, p, rng) for p in problems]
        assert all(
            task.parse(p, g) is not None for p, g in zip(problems, guesses, strict=True)
        )  # well formed
        right = sum(task.is_correct(p, g) for p, g in zip(problems, guesses, strict=True)) / len(problems)
        assert right < 0.35  # a guess is right only by chance (kk: 1 in 4 or 8; arith: 1 in 100)


def test_the_label_names_the_shipped_weights_recipe_and_hash():
    from reference_trainer.trace.records import read_json
    from rlbench.reproduce.base import Context

    digest = embedded.sha256(embedded.shipped_dir() / "model.safetensors")
    version = read_json(embedded.shipped_dir() / embedded.CARD)["recipe_version"]
    assert embedded.label() == f"embedded (recipe v{version}, sha256 {digest[:12]})"
    unused = Path("unused")
    assert Context(device="cpu", quick=True, model=None, work_dir=unused).model_label() == embedded.label()
    assert Context(device="cpu", quick=True, model="some/dir", work_dir=unused).model_label() == "some/dir"
