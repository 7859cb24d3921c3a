"""The fault drill's third round of hostile input (issue 43), each family with its neighbours: run files that
are symlinks, folders that hold another command's run, damaged checkpoints and weights, sampling values
that vanish in float32, JSON the interpreter refuses, shapes past any run, sizes that cannot run,
unbounded claims of servers and files, saved numbers a report would print wrongly, and paths and
messages. Every case must end in one line and exit 2 (or run cleanly where it says so), touch nothing
outside its folder, and lose nothing it was handed: "lost" counts protected files whose bytes changed."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from faults.fault_inputs import (
    TINY_RUN,
    TINY_SIMULATION,
    Check,
    Outcome,
    cli,
    one_line,
    write_suite,
    write_tiny_model,
)

Setup = Callable[[Path], tuple[tuple[str, ...], str, list[Path]]]  # d -> (command, must say, protected)


def refused(setup: Setup) -> Check:
    """The command `setup` prepares must be refused with one line naming what it says, and leave the
    protected files (those outside the run, the run's earlier work) byte for byte."""

    def check(d: Path) -> Outcome:
        args, text, protected = setup(d)
        before = {p: p.read_bytes() if p.is_file() else None for p in protected}
        result = one_line(cli(*args, cwd=d), text)
        result.lost = sum(
            1 for p, data in before.items() if (p.read_bytes() if p.is_file() else None) != data
        )
        return result

    return check


def notes(d: Path) -> Path:
    path = d / "notes.txt"
    path.write_text("the operator's notes\n")
    return path


def eval_args(model: Path, data: Path, *extra: str) -> tuple[str, ...]:
    return ("eval", "--suite", "amc23", "--data-dir", str(data), "--model", str(model), "--max-tokens", "2",
            *extra)  # fmt: skip


def run_command(command: str, model: Path, data: Path, out: str) -> tuple[str, ...]:
    return {
        "train": ("train", "--model", str(model), "--steps", "1", *TINY_RUN, "--out", out),
        "profile": ("profile", "--model", str(model), "--steps", "1", *TINY_RUN, "--out", out),
        "compare": (
            "compare",
            "--modes",
            "baseline",
            "--model",
            str(model),
            "--steps",
            "1",
            *TINY_RUN,
            "--out",
            out,
        ),  # fmt: skip
        "eval": eval_args(model, data, "--out", out),
        "observe": ("observe", "127.0.0.1:9", "--duration", "1", "--out", out),
        "simulate": ("simulate", *TINY_SIMULATION, "--out", out),
    }[command]


# ---- 1. run files that are symlinks ------------------------------------------------------------------------


def symlinked_lock(command: str, dangling: bool) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        model, data, target = write_tiny_model(d / "model"), write_suite(d / "data"), notes(d)
        (d / "run").mkdir()
        (d / "run" / ".rlbench.lock").symlink_to(d / "created-outside" if dangling else target)
        protected = [target, d / "created-outside"]  # neither written nor created through the link
        return run_command(command, model, data, "run"), ".rlbench.lock: is a symlink", protected

    return setup


def symlinked_log(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
    """A finished eval whose problems.jsonl (appended to in place) was replaced by a link to a file outside
    it, then rerun: the rerun trims and appends that file, so it must refuse the link."""
    model, data, target = write_tiny_model(d / "model"), write_suite(d / "data"), notes(d)
    target.write_text('{"mine": 1}\n')
    cli(*eval_args(model, data, "--out", "ev"), cwd=d)
    (d / "ev" / "problems.jsonl").unlink()
    (d / "ev" / "problems.jsonl").symlink_to(target)
    return eval_args(model, data, "--out", "ev"), "problems.jsonl: is a symlink", [target]


# ---- 2. folders that hold another command's run ------------------------------------------------------------

RUN_FILES = {
    "train": ["train_config.json", "metrics.jsonl", "report.html"],
    "eval": ["run_config.json", "problems.jsonl", "results.json", "report.html"],
    "observe": ["samples.jsonl", "metrics.json", "trace.jsonl", "report.html"],
    "simulate": ["simulate.json", "report.html"],
}


def foreign_folder(command: str, holds: str) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data")
        (d / "run").mkdir()
        for name in RUN_FILES[holds]:
            (d / "run" / name).write_text("{}\n" if name.endswith("json") else f"{holds}'s {name}\n")
        files = [d / "run" / name for name in RUN_FILES[holds]]
        return run_command(command, model, data, "run"), f"not {command}'s run: use another --out", files

    return setup


def finished(command: str) -> Setup:
    """A second compare or observe into a finished comparison or observation, without --overwrite."""

    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data")
        (d / "run").mkdir()
        name = "compare.json" if command == "compare" else "samples.jsonl"
        (d / "run" / name).write_text('{"runs": []}\n' if command == "compare" else '{"t": 0, "server": 0}\n')
        said = "already holds a comparison" if command == "compare" else "already holds an observation"
        return run_command(command, model, data, "run"), said, [d / "run" / name]

    return setup


# ---- 3. damaged checkpoints, weights, devices --------------------------------------------------------------


def _json_edit(path: Path, change: Callable[[dict], object]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def recast(path: Path, dtype: torch.dtype, poison: float | None = None) -> None:
    """Rewrite a checkpoint's MLP weight in `dtype`, its first entry `poison` when given."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name].to(dtype)
    if poison is not None:
        tensors[name][0, 0] = poison
    save_file(tensors, str(path), metadata={"format": "pt"})


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


CHECKPOINT_DAMAGE: list[tuple[str, Callable[[Path], object], str]] = [
    ("truncated optimizer.safetensors", lambda c: _truncate(c / "trainer" / "optimizer.safetensors", 100),
     "optimizer.safetensors"),
    ("empty optimizer.safetensors", lambda c: _truncate(c / "trainer" / "optimizer.safetensors", 0),
     "optimizer.safetensors"),
    ("truncated model.safetensors", lambda c: _truncate(c / "model.safetensors", 300), "model.safetensors"),
    ("trainer_state.json without stream",
     lambda c: _json_edit(c / "trainer" / "trainer_state.json", lambda s: s.pop("stream")), "stream"),
    ("3-byte torch_rng",
     lambda c: _json_edit(c / "trainer" / "trainer_state.json", lambda s: s.update(torch_rng=[1, 2, 3])),
     "torch_rng"),
    ('"step": "2"', lambda c: _json_edit(c / "trainer" / "trainer_state.json", lambda s: s.update(step="2")),
     "step is str"),
    ("step -1", lambda c: _json_edit(c / "trainer" / "trainer_state.json", lambda s: s.update(step=-1)),
     "must be >= 0"),
    ("stream of the wrong keys",
     lambda c: _json_edit(c / "trainer" / "trainer_state.json", lambda s: s.update(stream={"x": 1})),
     "cannot restore it"),
    ('optimizer.json {"param_groups": 5}',
     lambda c: (c / "trainer" / "optimizer.json").write_text('{"param_groups": 5}'), "optimizer.json"),
    ("optimizer.json a list", lambda c: (c / "trainer" / "optimizer.json").write_text("[]"),
     "optimizer.json"),
    ("int8 weights", lambda c: recast(c / "model.safetensors", torch.int8), "is I8, not floating point"),
    ("bool weights", lambda c: recast(c / "model.safetensors", torch.bool), "is BOOL"),
    ("I32 weights", lambda c: recast(c / "model.safetensors", torch.int32), "is I32"),
    ("a NaN weight", lambda c: recast(c / "model.safetensors", torch.float32, float("nan")), "NaN or inf"),
    ("latest not UTF-8", lambda c: (c.parent / "latest").write_bytes(b"\xff\xfe\n"), "latest"),
    ("latest a path out of the run", lambda c: (c.parent / "latest").write_text("../../../etc\n"), "latest"),
]  # fmt: skip


def damaged_checkpoint(finished_run: Path, damage: Callable[[Path], object], text: str) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        shutil.copytree(finished_run, d / "run")
        damage(d / "run" / "checkpoints" / "step-000002")
        return ("train", "--resume", "run", "--steps", "3"), text, [d / "run" / "metrics.jsonl"]

    return setup


def bad_weights(dtype: torch.dtype, poison: float | None, command: str, text: str) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data")
        recast(model / "model.safetensors", dtype, poison)
        if command == "generate":
            return ("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2"), text, []
        return eval_args(model, data, "--out", "ev"), text, []

    return setup


# ---- 4. sampling and update values, sizes ------------------------------------------------------------------


def option(command: str, *values: str, text: str = "") -> Setup:
    """`command` with `values` added; refused with one line naming `text` (default: the option)."""

    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        model, data = write_tiny_model(d / "model"), write_suite(d / "data")
        if command == "generate":
            args: tuple[str, ...] = ("generate", "--model", str(model), "--prompt", "x", "--max-tokens", "2")
        elif command == "eval":
            args = eval_args(model, data, "--out", "ev")
        else:
            args = ("train", "--model", str(model), "--steps", "1", *TINY_RUN, "--out", "run")
        return (*args, *values), text or values[0], []

    return setup


# ---- 5. JSON the interpreter refuses, shapes past any run --------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = '{"a": ' + "9" * 5000 + "}"
RESULTS = {
    "suite": "amc23",
    "model": "m",
    "engine": "reference",
    "template": "math",
    "samples": 1,
    "accuracy": 0.5,
    "problems_evaluated": 1,
}
EVENT = {"kind": "decode", "step": 0, "t_start": 0, "t_end": 1, "active_slots": 1, "capacity": 2}


def json_file(where: str, text: str) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        (d / "run").mkdir()
        if where in ("trace export", "report on a trace"):
            (d / "run" / "trace.jsonl").write_text(json.dumps(EVENT) + "\n" + text + "\n")
            args = ("trace", "export", "run") if where == "trace export" else ("report", "run")
            return args, "trace.jsonl:2", []
        if where in ("metrics.json", "results.json", "compare.json"):
            (d / "run" / where).write_text(text)
            return ("report", "run"), where, []
        model, data = write_tiny_model(d / "model"), write_suite(d / "data")
        if where == "config.json":
            (model / "config.json").write_text(text)
            return ("generate", "--model", str(model), "--prompt", "x"), "config.json", []
        if where == "char_tokenizer.json":
            (model / "char_tokenizer.json").write_text(text)
            return ("generate", "--model", str(model), "--prompt", "x"), "char_tokenizer.json", []
        (data / "amc23.jsonl").write_text(text + "\n")  # a suite row
        return eval_args(model, data, "--out", "ev"), "amc23.jsonl:1", []

    return setup


def trace_event(change: dict) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        (d / "run").mkdir()
        (d / "run" / "trace.jsonl").write_text(json.dumps({**EVENT, **change}) + "\n")
        return ("report", "run"), "trace.jsonl: event 1", []

    return setup


def saved(file: str, doc: object, text: str, command: str = "report") -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        (d / "run").mkdir()
        (d / "run" / file).write_text(json.dumps(doc))
        if command == "from-samples":
            row = {"t": 0.1, "server": 0, "running": 1, "waiting": 0}
            (d / "run" / "samples.jsonl").write_text(json.dumps(row) + "\n")
            return ("observe", "--from-samples", "run"), text, [d / "run" / "samples.jsonl"]
        if command == "eval":
            model, data = write_tiny_model(d / "model"), write_suite(d / "data")
            return eval_args(model, data, "--out", "run"), text, []
        return ("report", "run"), text, []

    return setup


def samples_row(row: dict, text: str) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        (d / "run").mkdir()
        good = {"t": 0.1, "server": 0, "running": 1, "waiting": 0}
        (d / "run" / "samples.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
        return ("observe", "--from-samples", "run"), f"samples.jsonl:2: {text}", [d / "run" / "samples.jsonl"]

    return setup


def tokenizer(doc: object, text: str) -> Setup:
    def setup(d: Path) -> tuple[tuple[str, ...], str, list[Path]]:
        model = write_tiny_model(d / "model")
        (model / "char_tokenizer.json").write_text(json.dumps(doc))
        return ("generate", "--model", str(model), "--prompt", "x"), text, []

    return setup


# ---- checks that are not refusals --------------------------------------------------------------------------


def counter_jump(d: Path) -> Outcome:
    """A rebuild from a server whose success counter jumps by 1e9 per scrape: bounded, said, exit 0."""
    (d / "obs").mkdir()
    rows = [{"t": 0.1 * k, "server": 0, "running": 2, "waiting": 0, "finished": k * 10**9,
             "generation_tokens": 10 * k} for k in range(30)]  # fmt: skip
    (d / "obs" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.perf_counter()
    ran = cli("observe", "--from-samples", "obs", cwd=d)
    seconds = time.perf_counter() - t0
    ok = ran.code == 0 and "not counted as requests" in ran.err and seconds < 30
    said = ran.err.strip()[-120:].replace("\n", " | ")
    return Outcome(ok, f"exit {ran.code}, {seconds:.1f} s: {said}", traceback=ran.traceback)


def load_balancer(d: Path) -> Outcome:
    """Counters that go backwards on every other scrape (two backends behind one URL) are said to be so."""
    (d / "obs").mkdir()
    rows = [{"t": 0.1 * k, "server": 0, "running": 2, "waiting": 0, "finished": 1000 * (k % 2) + k,
             "generation_tokens": 10**6 * (k % 2) + k, "restarted": k % 2 == 0 and k > 0}
            for k in range(30)]  # fmt: skip
    (d / "obs" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ran = cli("observe", "--from-samples", "obs", cwd=d)
    ok = ran.code == 0 and "one URL in front of several servers" in ran.err
    return Outcome(ok, f"exit {ran.code}: {ran.err.strip()[-120:]}", traceback=ran.traceback)


def many_servers(d: Path) -> Outcome:
    """A rebuild of 300 servers' scrapes: a report in seconds (66 of 71 s went to the figure before)."""
    (d / "obs").mkdir()
    rows = [{"t": 0.1 * k, "server": s, "running": (k + s) % 3, "waiting": 0, "finished": k,
             "generation_tokens": 10 * k} for s in range(300) for k in range(40)]  # fmt: skip
    (d / "obs" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.perf_counter()
    ran = cli("observe", "--from-samples", "obs", cwd=d)
    seconds = time.perf_counter() - t0
    return Outcome(
        ran.code == 0 and seconds < 20, f"exit {ran.code}, {seconds:.1f} s", traceback=ran.traceback
    )


def checkpoint_mode(d: Path) -> Outcome:
    """Checkpoints get the mode any file gets (0644 under umask 022), not safetensors' 0600."""
    model = write_tiny_model(d / "model")
    old = os.umask(0o022)
    try:
        ran = cli("train", "--model", str(model), "--steps", "1", *TINY_RUN, "--out", "run", cwd=d)
    finally:
        os.umask(old)
    files = list((d / "run" / "checkpoints").rglob("*.safetensors"))
    modes = {oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    return Outcome(ran.code == 0 and bool(files) and modes == {"0o644"}, f"modes {sorted(modes)}",
                   traceback=ran.traceback)  # fmt: skip


def long_name(d: Path) -> Outcome:
    """A legal 250-byte --out file name is written (its temp name fits NAME_MAX too)."""
    (d / "run").mkdir()
    (d / "run" / "trace.jsonl").write_text(json.dumps(EVENT) + "\n")
    name = "t" * 245 + ".json"
    ran = cli("trace", "export", "run", "--out", name, cwd=d)
    return Outcome(ran.code == 0 and (d / name).is_file(), f"exit {ran.code}: {ran.err.strip()[-120:]}",
                   traceback=ran.traceback)  # fmt: skip


def newline_path(d: Path) -> Outcome:
    (d / "a\nb").mkdir()
    ran = cli("report", "a\nb", cwd=d)
    result = one_line(ran)
    return Outcome(result.ok and "a\\nb" in ran.err, result.detail, traceback=result.traceback)


# ---- the group ---------------------------------------------------------------------------------------------


def hostile_round3(work: Path) -> Iterator[tuple[str, Check]]:
    for command in ("train", "profile", "compare", "eval", "observe", "simulate"):
        yield f"symlinked .rlbench.lock ({command})", refused(symlinked_lock(command, dangling=False))
    yield "dangling symlinked .rlbench.lock (train)", refused(symlinked_lock("train", dangling=True))
    yield "symlinked problems.jsonl (eval rerun)", refused(symlinked_log)
    for command in ("train", "profile", "compare", "eval", "observe", "simulate"):
        for holds in RUN_FILES:
            if command != holds and not (command == "profile" and holds == "train"):
                yield f"{command} --out <a {holds} run>", refused(foreign_folder(command, holds))
    for command in ("compare", "observe"):
        yield f"{command} into a finished one, no --overwrite", refused(finished(command))

    finished_run = work / "finished-run"
    model = write_tiny_model(work / "model")
    cli("train", "--model", str(model), "--steps", "2", "--checkpoint-every", "2", *TINY_RUN, "--out",
        str(finished_run), cwd=work)  # fmt: skip
    for name, damage, text in CHECKPOINT_DAMAGE:
        yield f"checkpoint: {name} (--resume)", refused(damaged_checkpoint(finished_run, damage, text))
    weights = [("int8", torch.int8, None, "is I8"), ("bool", torch.bool, None, "is BOOL"),
               ("I32", torch.int32, None, "is I32"), ("a NaN", torch.float32, float("nan"), "NaN or inf"),
               ("an inf", torch.float32, float("inf"), "NaN or inf")]  # fmt: skip
    for label, dtype, poison, text in weights:
        for command in ("generate", "eval"):
            yield f"weights: {label} ({command})", refused(bad_weights(dtype, poison, command, text))
    yield "generate --device meta", refused(option("generate", "--device", "meta", text="device 'meta'"))

    for command in ("generate", "eval"):
        for flag, value in (("--temperature", "1e-320"), ("--temperature", "5e-324"), ("--top-p", "1e-320"),
                            ("--temperature", "1e300")):  # fmt: skip
            yield f"{command} {flag} {value}", refused(option(command, flag, value))
    for flag in ("--lr", "--kl-coef", "--temperature"):
        yield f"train {flag} 1e300", refused(option("train", flag, "1e300"))
    yield "train --temperature 1e-320", refused(option("train", "--temperature", "1e-320"))
    yield "train --group-size 2147483647", refused(option("train", "--group-size", "2147483647"))
    yield "train --prompts-per-step 2147483647", refused(option("train", "--prompts-per-step", "2147483647"))
    yield "eval -k 2147483647", refused(option("eval", "-k", "2147483647"))
    yield (
        "train --task-option max_ops=abc",
        refused(option("train", "--task-option", "max_ops=abc", text="option max_ops must be int")),
    )

    for where in ("trace export", "report on a trace", "metrics.json", "results.json", "compare.json",
                  "config.json", "char_tokenizer.json", "suite row"):  # fmt: skip
        for kind, text in (("deep nesting", DEEP), ("a 5000-digit integer", HUGE)):
            yield f"JSON {kind}: {where}", refused(json_file(where, text))
    for name, change in (("tokens Infinity", {"tokens": float("inf")}), ("t_end 1e308", {"t_end": 1e308}),
                         ("t_start -1e308", {"t_start": -1e308}), ("t_end before t_start", {"t_start": 5}),
                         ("capacity 1e300", {"capacity": 1e300})):  # fmt: skip
        yield f"trace event: {name} (report)", refused(trace_event(change))
    yield "eval run_config.json a list", refused(saved("run_config.json", [1], "run_config.json", "eval"))
    yield "metrics.json a list (--from-samples)", refused(saved("metrics.json", [1], "metrics.json",
                                                                 "from-samples"))  # fmt: skip
    yield "char_tokenizer.json a list", refused(tokenizer([1, 2], "char_tokenizer.json: not a JSON object"))
    yield "char_tokenizer.json without vocab", refused(tokenizer({"type": "char"}, "vocab is not a list"))
    yield (
        "a 4-token char tokenizer for a 99-token model",
        refused(tokenizer({"type": "char", "vocab": ["<pad>", "<bos>", "<eos>", "a"]}, "4 tokens")),
    )
    for name, row, text in (("server 1e9", {"t": 1.0, "server": 10**9}, "server is"),
                            ("t 1e308", {"t": 1e308, "server": 0}, "t is"),
                            ("a counter of 1e300", {"t": 1.0, "server": 0, "running": 1, "finished": 1e300},
                             "finished is")):  # fmt: skip
        yield f"samples row: {name} (--from-samples)", refused(samples_row(row, text))
    yield "samples: a counter jumping by 1e9 per scrape", counter_jump
    yield "samples: counters backwards every other scrape", load_balancer
    yield "samples: 300 servers in one report", many_servers

    for file, doc, text in (
        ("metrics.json", {"summary": {"bubble_ratio": float("-inf")}, "steps": []}, "bubble_ratio"),
        ("metrics.json", {"summary": {"bubble_ratio": 45.0}, "steps": []}, "bubble_ratio"),
        ("metrics.json", {"summary": {"step_time_s": -5}, "steps": []}, "step_time_s"),
        ("compare.json", {"runs": [{"mode": "baseline", "summary": {"step_time_s": float("nan")}}]},
         "step_time_s"),
        ("compare.json", {"runs": [{"mode": "baseline", "summary": {"bubble_ratio": float("inf")}}]},
         "bubble_ratio"),
        ("results.json", {**RESULTS, "accuracy": 45.0}, "accuracy is 45.0"),
        ("results.json", {**RESULTS, "pass_at_k": {"1": float("inf")}}, "pass_at_k"),
    ):  # fmt: skip
        yield f"{file}: {text} out of range (report)", refused(saved(file, doc, text))
    yield "checkpoints readable as any file (0644)", checkpoint_mode
    yield "a 250-byte --out name", long_name
    yield "a newline in a path", newline_path
