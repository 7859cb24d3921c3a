"""The fault drill's shared pieces (a command run in process, the one-line check, a tiny model and suite) and
its corrupt-input group: model directories whose config.json lies, refused chat templates, bad suite rows,
wrongly typed traces, run configs and saved results. Each must end in one line and exit 2, never a
traceback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

Check = Callable[[Path], "Outcome"]


@dataclass
class Outcome:
    ok: bool
    detail: str = ""
    lost: int = 0  # finished work or intact data that the fault destroyed
    traceback: bool = False
    failure: str = ""  # the class of a failure, where a group says one (fault_surfaces.py)


class Accepted(Exception):
    """The option fuzz's stub was reached: the command accepted the value and started its work."""


@dataclass
class Ran:
    code: int | None
    out: str
    err: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.err


def cli(*args: str, cwd: Path) -> Ran:
    """`rlbench ARGS` in this process, as the console script runs it; an exception escaping the CLI is a
    traceback (code None)."""
    from rlbench.cli import app

    out, err = io.StringIO(), io.StringIO()
    saved_cwd, saved_argv, threads = os.getcwd(), sys.argv, torch.get_num_threads()
    code: int | None = 0
    os.chdir(cwd)
    sys.argv = ["rlbench", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            app()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except Accepted:  # the option fuzz's stub: the command reached its work
        raise
    except BaseException:  # what the drill counts: anything escaping the CLI is a traceback
        code, _ = None, err.write(traceback.format_exc())
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        torch.set_num_threads(threads)
    return Ran(code, out.getvalue(), err.getvalue())


def one_line(ran: Ran, text: str = "", after_progress: bool = False) -> Outcome:
    """The refusal every bad input must get: exit 2, one line starting `error:`, naming `text` (with
    `after_progress`, the last line of what the command said, after its progress lines)."""
    said = ran.err.strip().splitlines()[-1:] if after_progress else [ran.err.rstrip("\n")]
    errors = sum(line.startswith("error: ") for line in ran.err.splitlines())
    ok = (
        ran.code == 2
        and errors == 1
        and said[0].startswith("error: ")
        and "\n" not in said[0]
        and text in said[0]
    )
    return Outcome(ok, ran.err.strip()[-300:] or f"exit {ran.code}", traceback=ran.traceback)


def write_tiny_model(path: Path, vocab: int | None = None) -> Path:
    """A random 2-layer char-level model (the embedded model's format at toy size)."""
    from reference_trainer.model.config import ModelConfig
    from reference_trainer.model.decoder import DecoderLM
    from reference_trainer.model.loader import save_model
    from reference_trainer.model.tokenizer import CharTokenizer

    torch.manual_seed(0)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    save_model(DecoderLM(ModelConfig(vocab_size=vocab or 99, bos_token_id=1, eos_token_id=2,
                                     max_position_embeddings=256, **shape)), path)  # fmt: skip
    CharTokenizer().save(path)
    return path


def damage(path: Path, how: str) -> None:
    """Remove the file at `path` ("deleted"), or put in its place a folder, a FIFO or a link to /dev/zero."""
    path.unlink()
    if how == "folder":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")


def write_suite(data: Path, rows: int = 3, name: str = "amc23.jsonl") -> Path:
    data.mkdir(parents=True, exist_ok=True)
    lines = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(rows)]
    (data / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return data


TINY_RUN = ("--prompts-per-step", "1", "--group-size", "2", "--max-tokens", "4", "--eval-every", "0")
# A simulation that takes a moment: one step of a small synthetic workload on one worker.
TINY_SIMULATION = ("--synthetic", "--workers", "1", "--steps", "1", "--prompts", "2")

# ---- option fuzz: shared with tests/test_option_fuzz.py -------------------------------------------------

FUZZ_VALUES = ("0", "-3", "nan", "inf", "1e999", str(2**70))
# Where each command's work starts: a value that reaches it was accepted by the checks up front.
FUZZ_STUBS = {
    "train": "rlbench.training.run_training",
    "profile": "rlbench.profiling.session.run_profile",
    "compare": "rlbench.profiling.compare.ProfileSession",  # after every check, before anything runs
    "observe": "rlbench.profiling.observe.observe",
    "simulate": "rlbench.simulate.workload.synthetic",
    "simulate validate": "rlbench.simulate.replay.validate_runs",  # runs found, none read
    "eval": "rlbench.evaluate.run_eval",
    "generate": "reference_trainer.rollout.engines.build_rollout_engine",
    "embedded build": "reference_trainer.train.recipe.build",
    "import lengths": "rlbench.integrations.imports.import_lengths",
    "import verl": "rlbench.integrations.imports.import_verl",
    "import trl": "rlbench.integrations.imports.import_trl",
    "audit": "rlbench.integrations.audit.audit",
}


def fuzz_base_args(model: str, data: Path) -> dict[str, tuple[str, ...]]:
    """Valid, cheap arguments for each command with numeric options (model: a model directory; data: a
    folder with amc23.jsonl), beside which one option at a time is fuzzed."""
    run = ("--model", model, *TINY_RUN)
    return {
        "train": (*run, "--steps", "1"),
        "profile": (*run, "--steps", "1"),
        "compare": (*run, "--steps", "1", "--modes", "baseline"),
        "observe": ("127.0.0.1:9", "--duration", "1"),
        "simulate": (*TINY_SIMULATION, "--modes", "baseline"),
        "simulate validate": (str(data / "amc23.jsonl"),),  # found, not read
        "eval": ("--suite", "amc23", "--data-dir", str(data), "--model", model, "--max-tokens", "2"),
        "generate": ("--model", model, "--prompt", "x", "--max-tokens", "2"),
        "embedded build": (),
        "import lengths": ("lengths.jsonl", "--workers", "1"),  # the stub stands in before the file is read
        "import verl": ("exp.jsonl", "--workers", "1"),
        "import trl": ("output_dir", "--workers", "1"),
        "audit": ("log.jsonl",),  # the stub stands in before the file is read
    }


# ---- corrupt inputs ----------------------------------------------------------------------------------------

CONFIG_LIES: list[tuple[str, Any]] = [
    ("hidden size", {"hidden_size": 48}),
    ("vocabulary", {"vocab_size": 120}),
    ("head count 0", {"num_attention_heads": 0}),
    ("negative dimension", {"intermediate_size": -64}),
    ("1e9 dimension", {"hidden_size": 10**9}),
    ("dimension as text", {"hidden_size": "32"}),
    ("kv heads", {"num_key_value_heads": 3}),
    ("eps as text", {"rms_norm_eps": "tiny"}),
    ("eos past vocab", {"eos_token_id": 500}),
    ("context 1e12", {"max_position_embeddings": 10**12}),
    ("layers", {"num_hidden_layers": 3}),
    ("JSON list", "list"),
]
TEMPLATES = [
    "{% if %}",
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ messages.append(1) }}",
    "{{ raise_exception('no') }}",
    "{{ undefined_function() }}",
    "{{ messages[7].content.upper() }}",
    "{{ 1 / 0 }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ range(10**9) | list }}",
    "{{ messages | tojson(separators=1) }}",
    5,
    [{"name": "default", "template": "{% for %}"}],
]
ROW = {"id": "a", "problem": "What is 1 + 1?", "answer": "2"}
SUITE_ROWS: list[tuple[str, bytes]] = [
    ("list subject", json.dumps({**ROW, "subject": ["a", "b"]}).encode()),
    ("dict level", json.dumps({**ROW, "level": {"n": 1}}).encode()),
    ("null problem", json.dumps({**ROW, "problem": None}).encode()),
    ("null answer", json.dumps({**ROW, "answer": None}).encode()),
    ("list answer", json.dumps({**ROW, "answer": [1]}).encode()),
    ("lone surrogate", b'{"id": "a", "problem": "x \\ud800", "answer": "2"}'),
    ("not UTF-8", b'{"id": "a", "problem": "\xff\xfe", "answer": "2"}'),
    ("not an object", b"[1, 2, 3]"),
    ("no id", json.dumps({"problem": "p", "answer": "1"}).encode()),
    ("torn last line", b'{"id": "a", "problem": "p", "ans'),
]
DECODE = {"kind": "decode", "step": 0, "t_start": 0, "t_end": 1, "active_slots": 1, "capacity": 2}
TRACE_ROWS = [
    ("no t_end", {"kind": "rollout", "step": 0, "t_start": 0.0}),
    ("time as text", {**DECODE, "t_start": "soon"}),
    ("negative worker", {**DECODE, "worker": -1}),
    ("sequence without id", {"kind": "sequence", "step": 0, "t_admit": 0, "t_finish": 1}),
    ("slots not a map", {**DECODE, "slots": [1]}),
    ("nan time", {"kind": "update", "step": 0, "t_start": float("nan"), "t_end": 1}),
]
RUN_CONFIGS = [
    ("a list", []),
    ("steps as text", {"steps": "x"}),
    ("grpo a list", {"grpo": [1]}),
    ("unknown grpo field", {"grpo": {"bogus": 1}}),
    ("kl_coef inf", {"grpo": {"kl_coef": float("inf")}}),
]
METRICS_DOCS = [
    ("metrics.json", "a list", [1]),
    ("metrics.json", "summary a list", {"summary": [], "steps": []}),
    ("metrics.json", "steps not rows", {"summary": {}, "steps": [1, 2]}),
    ("metrics.json", "run a number", {"run": 3}),
    ("metrics.json", "a bubble ratio as text", {"summary": {"bubble_ratio": "low"}, "steps": [{"step": 0}]}),
    ("compare.json", "a list", [1]),
    ("compare.json", "runs not a list", {"runs": 3}),
    ("compare.json", "a run without summary", {"runs": [{"mode": "baseline"}]}),
    (
        "compare.json",
        "a step time as text",
        {"runs": [{"mode": "baseline", "summary": {"step_time_s": "x"}}]},
    ),
    ("results.json", "a list", [1]),
    ("results.json", "samples as text", {"suite": "amc23", "samples": "2"}),
]


def corrupt_inputs(work: Path) -> Iterator[tuple[str, Check]]:
    """(case name, check) for the bad-input group."""
    data = write_suite(work / "data")
    for name, lie in CONFIG_LIES:
        for command in ("generate", "eval", "train"):
            yield f"config.json: {name} ({command})", _config_lie(lie, command, data)
    for template in TEMPLATES:
        yield f"chat template {str(template)[:40]!r}", _template(template)
    for name, line in SUITE_ROWS:
        yield f"suite row: {name}", _suite_row(line)
    for name, row in TRACE_ROWS:
        for command in ("report", "trace export"):
            yield f"trace row: {name} ({command})", _trace_row(row, command)
    for name, change in RUN_CONFIGS:
        yield f"train_config.json: {name} (--resume)", _run_config(change)
    for file, name, doc in METRICS_DOCS:
        yield f"{file}: {name} (report)", _saved_doc(file, doc)


def _config_lie(lie: Any, command: str, data: Path) -> Check:
    def check(d: Path) -> Outcome:
        model = write_tiny_model(d / "model")
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps([config] if lie == "list" else {**config, **lie}))
        args = {
            "generate": ("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2"),
            "eval": (
                "eval",
                "--suite",
                "amc23",
                "--data-dir",
                str(data),
                "--model",
                str(model),
                "--out",
                "ev",
            ),
            "train": ("train", "--model", str(model), "--steps", "1", *TINY_RUN, "--out", "run"),
        }[command]
        return one_line(cli(*args, cwd=d), str(model))

    return check


def _template(template: Any) -> Check:
    def check(d: Path) -> Outcome:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<unk>", "<|endoftext|>", "<|im_end|>"]
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        tok.train_from_iterator(["hello world", "what is 2 + 2"], trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=alphabet))  # fmt: skip
        model = write_tiny_model(d / "model", vocab=tok.get_vocab_size())
        (model / "char_tokenizer.json").unlink()
        tok.save(str(model / "tokenizer.json"))
        config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template}
        (model / "tokenizer_config.json").write_text(json.dumps(config))
        ran = cli("generate", "--model", str(model), "--prompt", "hello", "--max-tokens", "2", cwd=d)
        return one_line(ran, "the chat template was refused")

    return check


def _suite_row(line: bytes) -> Check:
    def check(d: Path) -> Outcome:
        data = d / "data"
        data.mkdir()
        (data / "aime24.jsonl").write_bytes(json.dumps(ROW).encode() + b"\n" + line + b"\n")
        model = write_tiny_model(d / "model")
        ran = cli(
            "eval", "--suite", "aime24", "--data-dir", str(data), "--model", str(model), "--out", "ev", cwd=d
        )
        result = one_line(ran, "aime24.jsonl:2: ")
        result.ok = result.ok and not (d / "ev").exists()  # refused before anything ran
        listing = cli("suites", "--data-dir", str(data), cwd=d)
        result.ok = result.ok and listing.code == 0
        result.traceback = result.traceback or listing.traceback
        return result

    return check


def _trace_row(row: dict[str, Any], command: str) -> Check:
    def check(d: Path) -> Outcome:
        run = d / "run"
        run.mkdir()
        good = {"kind": "rollout", "step": 0, "t_start": 0.0, "t_end": 1.0}
        (run / "trace.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
        args = ("report", str(run)) if command == "report" else ("trace", "export", str(run))
        return one_line(cli(*args, cwd=d), "trace.jsonl: event 2")

    return check


def _run_config(change: Any) -> Check:
    def check(d: Path) -> Outcome:
        run = d / "run"
        run.mkdir()
        raw = change if isinstance(change, list) else {"steps": 2, "eval_every": 0, **change}
        (run / "train_config.json").write_text(json.dumps(raw))
        return one_line(cli("train", "--resume", str(run), cwd=d), "train_config.json")

    return check


def _saved_doc(file: str, doc: Any) -> Check:
    def check(d: Path) -> Outcome:
        run = d / "run"
        run.mkdir()
        (run / file).write_text(json.dumps(doc))
        return one_line(cli("report", str(run), cwd=d), str(run))

    return check
