"""The fault drill's fourth round (issue 55): the surfaces added since the third, each family with its
neighbours. Suite files and groups (`suites validate`, `eval --suite`), `import lengths|verl|trl`, the TRL
callback (`rlbench.integrations.trl`), the lookahead and suffix modes, `observe --from-samples`.

Every case runs in a process of its own under a deadline (HANG_S) and an address-space cap (MEMORY_CAP), so
a hang or an unbounded allocation is a failure of its own class, not a stuck drill; the process reports its
peak memory. A case fails in one class, the first that applies:
- hang: past its deadline;  memory: a MemoryError, or a peak past the case's bound;
- traceback: a Traceback on stderr;  lost: a protected file changed (the "lost" count);
- outside: a file created where the case allows none (outside the run, or a run folder for a refusal);
- control: a raw terminal control byte (ESC, BEL) in what the command printed;
- wrong: not ending as it must (an accepted bad input, a refusal that is not one line naming the problem).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from faults.fault_inputs import Check, Outcome, write_tiny_model
from faults.fault_runs import ROOT

HANG_S = 120.0
MEMORY_CAP = 4 << 30  # address space: a MemoryError past it, where an unbounded read would take the machine
REFUSAL_RSS = 1 << 30  # a refusal must come before its command holds this much
LAUNCH = textwrap.dedent(
    """
    import atexit, os, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (int(os.environ["DRILL_CAP"]),) * 2)
    def peak():  # this process's own peak: VmHWM (ru_maxrss keeps the drill's own size from the fork)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    atexit.register(lambda: open(os.environ["DRILL_RSS"], "w").write(str(peak())))
    if sys.argv[1] == "-c":
        sys.argv = sys.argv[2:]
        exec(sys.argv[0])
    else:
        from rlbench.cli import app
        sys.argv = ["rlbench", *sys.argv[1:]]
        app()
    """
)


@dataclass
class Proc:
    code: int | None  # None: killed at its deadline
    out: str
    err: str
    rss: int  # peak resident bytes (0: unknown, the process did not exit itself)


def run(args: list[str], cwd: Path, timeout: float = HANG_S, python: str | None = None) -> Proc:
    """`rlbench ARGS` (or, with `python`, that code with ARGS as sys.argv[1:]) in a process of its own
    under the drill's deadline and memory cap."""
    rss_file = Path(tempfile.gettempdir()) / f"rlbench-drill-{os.getpid()}.rss"  # not in a case's folder
    rss_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DRILL_CAP": str(MEMORY_CAP),
           "DRILL_RSS": str(rss_file), "RLBENCH_CACHE_DIR": str(cwd / ".cache")}  # fmt: skip
    argv = [sys.executable, "-c", LAUNCH, *(["-c", python] if python else []), *args]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="surrogateescape", start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    rss = int(rss_file.read_text()) if rss_file.is_file() and rss_file.read_text() else 0
    return Proc(code, out, err, rss)


@dataclass
class Case:
    """What one case must do: `refuse` with one line holding `said` (exit 2), or run (exit 0); leave the
    `protected` files byte for byte and create nothing under `outside`; stay under `rss` bytes."""

    args: list[str]
    said: str = ""
    refuse: bool = True
    protected: list[Path] = field(default_factory=list)
    outside: tuple[Path, ...] = ()  # folders where nothing may appear
    rss: int = REFUSAL_RSS
    python: str | None = None  # run this code instead of the CLI (the TRL callback)
    timeout: float = HANG_S
    cwd: Path | None = None  # where the command runs (default: the case's folder)


def judged(setup: Callable[[Path], Case]) -> Check:
    def check(d: Path) -> Outcome:
        case = setup(d)
        before = {p: p.read_bytes() if p.is_file() else None for p in case.protected}
        outside = _files(case.outside, d)
        ran = run(case.args, case.cwd or d, case.timeout, case.python)
        lost = sum((p.read_bytes() if p.is_file() else None) != data for p, data in before.items())
        created = len(_files(case.outside, d) - outside)
        return _verdict(case, ran, lost, created)

    return check


def _files(folders: tuple[Path, ...], case_dir: Path) -> set[Path]:
    """What the folders hold; in a folder above the case's, what lies outside the case's own folder."""
    return {
        p
        for f in folders
        for p in f.rglob("*")
        if f.is_relative_to(case_dir) or not p.is_relative_to(case_dir)
    }


def _verdict(case: Case, ran: Proc, lost: int, created: int) -> Outcome:
    lines = ran.err.strip().splitlines() or [f"exit {ran.code}"]
    last = (lines[0] if case.args[:2] == ["suites", "validate"] else lines[-1])[-200:]
    detail = f"exit {ran.code}, {ran.rss / 2**20:.0f} MiB: {last}"
    traceback = "Traceback" in ran.err
    if ran.code is None:
        return Outcome(False, f"hang: no end within {case.timeout:.0f} s", lost, traceback, "hang")
    if "MemoryError" in ran.err or ran.rss > case.rss:
        return Outcome(False, f"memory: {detail}", lost, traceback, "memory")
    if traceback:
        return Outcome(False, detail, lost, True, "traceback")
    if lost:
        return Outcome(False, f"lost {lost}: {detail}", lost, False, "lost")
    if created:
        return Outcome(False, f"created {created} file(s) outside: {detail}", 0, False, "outside")
    if any(c in ran.out + ran.err for c in ("\x1b", "\x07", "\x9b")):
        return Outcome(False, f"control bytes printed: {detail}", 0, False, "control")
    errors = [line for line in ran.err.splitlines() if line.startswith("error: ")]
    if case.refuse and case.args[:2] == ["suites", "validate"]:  # a line per problem, then the one error
        ok = ran.code == 2 and len(errors) == 1 and case.said in ran.err
    elif case.refuse:
        ok = ran.code == 2 and len(errors) == 1 and case.said in errors[0]
    else:
        ok = ran.code == 0 and case.said in ran.out + ran.err
    return Outcome(ok, detail, 0, False, "" if ok else "wrong")


# ---- pieces ----------------------------------------------------------------------------------------------

BOMB_ANCHORS = "".join(
    f"_{n}: &{n} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
    for n, p in zip("abcdefgh", ["", *"abcdefg"], strict=True)
)
BOMB = "[*h, *h, *h, *h, *h, *h, *h, *h, *h]"  # 9^9 nodes from 324 bytes


def suite(folder: Path, name: str = "s", file: str = "s.yaml", **keys: object) -> Path:
    """A suite file (JSON is YAML) with its data beside it; `keys` replace or add keys (raw YAML text
    where the value is a `str` starting with `!yaml `)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "d.jsonl").write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n')
    doc: dict[str, object] = {"name": name, "data": {"file": "d.jsonl"}, "prompt": "math", "grader": "math",
                              "sampling": {"max_tokens": 2}}  # fmt: skip
    raw = {k: v[6:] for k, v in keys.items() if isinstance(v, str) and v.startswith("!yaml ")}
    doc.update({k: v for k, v in keys.items() if k not in raw})
    text = "".join(f"{k}: {json.dumps(v)}\n" for k, v in doc.items() if k not in raw)
    raw_text = "".join(f"{k}: {v}\n" for k, v in raw.items())
    (folder / file).write_text(BOMB_ANCHORS * bool(raw) + text + raw_text)
    return folder / file


def group(folder: Path, *members: str, body: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "g.yaml").write_text(body or json.dumps({"group": "g", "suites": list(members)}))
    return folder / "g.yaml"


def length_log(path: Path, rows: Iterator[dict] | list[dict], raw: str = "") -> Path:
    with open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
        fh.write(raw)
    return path


def validate(path: str, said: str) -> Callable[[Path], Case]:
    return lambda d: Case(["suites", "validate", path], said)


# ---- 1. the TRL callback ---------------------------------------------------------------------------------

RECORD = textwrap.dedent(
    """
    import sys, types
    from rlbench.integrations.trl import RLBenchRecorder
    kwargs = eval(sys.argv[2]) if len(sys.argv) > 2 else {}
    args, state = types.SimpleNamespace(num_generations=2), types.SimpleNamespace(global_step=0)
    try:
        recorder = RLBenchRecorder(sys.argv[1], **kwargs)
        recorder.on_train_begin(args, state, None)  # the first moment TRL hands it a run
        recorder.on_step_begin(args, state, None)
        recorder.on_step_end(args, state, None)  # a step of TRL's run appended to the folder's trace
        if len(sys.argv) > 3:  # a second recorder on the same folder
            RLBenchRecorder(sys.argv[1])
    except Exception as err:
        if type(err).__name__ != "UserError":
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    """
)


def recorder_on(files: dict[str, str], said: str) -> Callable[[Path], Case]:
    def setup(d: Path) -> Case:
        (d / "run").mkdir()
        for name, text in files.items():
            (d / "run" / name).write_text(text)
        protected = [d / "run" / name for name in files]
        if "trace.jsonl" not in files:  # a trace must not appear in another command's run
            protected.append(d / "run" / "trace.jsonl")
        return Case(["run"], said, protected=protected, python=RECORD)

    return setup


def recorder_twice(d: Path) -> Case:
    return Case(["run", "{}", "again"], "another RLBenchRecorder", python=RECORD)


def recorder_argument(kwargs: str, said: str) -> Callable[[Path], Case]:
    return lambda d: Case(["run", kwargs], said, python=RECORD)


def trl_callback(work: Path) -> Iterator[tuple[str, Check]]:
    train = {"train_config.json": "{}", "metrics.jsonl": "", "trace.jsonl": '{"kind": "update"}\n'}
    holds = {
        "a finished train run": (train, "holds a training run"),
        "an eval run": ({"run_config.json": "{}", "problems.jsonl": "", "results.json": "{}"}, "evaluation"),
        "a recorded TRL run": ({"imported.json": "{}", "trace.jsonl": '{"kind": "update"}\n'}, "already"),
        "a folder with a foreign trace.jsonl": ({"trace.jsonl": '{"kind": "update"}\n'}, "already holds"),
        "a profile": ({"metrics.json": "{}", "trace.jsonl": "", "report.html": ""}, "holds a profile"),
    }
    for what, (files, said) in holds.items():
        yield f"trl callback on {what}", judged(recorder_on(files, said))
    yield "trl callback: two recorders on one folder", judged(recorder_twice)
    for kwargs, said in (
        ("{'slots': 0}", "--slots must be"),
        ("{'slots': 2**63}", "--slots must be"),
        ("{'whatif_workers': (0,)}", "--workers must be"),
        ("{'whatif_workers': (2**40,)}", "--workers must be"),
        ("{'gpu': 'tpu'}", "unknown GPU preset"),
        ("{'model_size': '900b'}", "no preset"),
    ):
        yield f"trl callback argument {kwargs}", judged(recorder_argument(kwargs, said))


# ---- 2. suite files and groups ---------------------------------------------------------------------------


def member_named(name: str, command: str) -> Callable[[Path], Case]:
    """A group member whose `name:` leads outside --out: eval wrote there (and replaced its report.html)."""

    def setup(d: Path) -> Case:
        foreign = d / "foreign_dir"
        foreign.mkdir()
        (foreign / "report.html").write_text("someone else's page\n")
        target = str(foreign) if name == "ABS" else name
        suite(d / "work" / "g", name=target, file="m.yaml")
        g = str(group(d / "work" / "g", "m"))  # a member by name: found beside the group file
        args = ["suites", "validate", g] if command == "validate" else \
            ["eval", "--suite", g, "--out", "out", "--model", str(write_tiny_model(d / "model"))]  # fmt: skip
        protected = [foreign / "report.html"]
        return Case(args, "not a plain name", protected=protected, outside=(foreign, d.parent))

    return setup


def suite_files(work: Path) -> Iterator[tuple[str, Check]]:
    for name in ("ABS", "../../escaped_eval", "a/b", "..", "x\x1b]0;t\x07"):
        for command in ("eval", "validate"):
            yield f"group member name {name!r}: {command}", judged(member_named(name, command))

    def data_file(file: str) -> Callable[[Path], Case]:
        def setup(d: Path) -> Case:
            for there in (d / "outside" / "x.jsonl", d / "x.jsonl"):  # readable data outside the suite
                there.parent.mkdir(exist_ok=True)
                there.write_text('{"id": "a", "problem": "1+1?", "answer": "2"}\n')
            path = str(suite(d / "s", data={"file": file.replace("ABS", str(d / "x.jsonl"))}))
            return Case(["suites", "validate", path], "data.file")

        return setup

    for file in ("../outside/x.jsonl", "ABS", "a/../../x.jsonl", "x" * 5000):
        yield f"data.file {file[:30]!r}", judged(data_file(file))

    def member_path(member: str) -> Callable[[Path], Case]:
        def setup(d: Path) -> Case:
            suite(d, name="outside", file="outside.yaml")  # a readable suite outside the group's folder
            g = group(d / "g", member.replace("ABS", str(d / "outside.yaml")))
            return Case(["suites", "validate", str(g)], "leads outside", cwd=d / "g")

        return setup

    for member in ("../outside.yaml", "ABS"):
        yield f"group member path {member!r}", judged(member_path(member))

    def same_name(d: Path) -> Case:
        suite(d / "g", name="same", file="a.yaml")
        suite(d / "g", name="same", file="b.yaml")
        return Case(["suites", "validate", str(group(d / "g", "a.yaml", "b.yaml"))], "both named")

    yield "two group members of one name", judged(same_name)

    bombs = {
        "title": {"title": f"!yaml {BOMB}"},
        "sampling": {"sampling": f"!yaml {{temperature: {BOMB}}}"},
        "metrics": {"metrics": f"!yaml {BOMB}"},
        "data.fields": {"data": f"!yaml {{file: d.jsonl, fields: {{problem: {BOMB}}}}}"},
    }
    for where, keys in bombs.items():
        for command in ("validate", "eval"):

            def bomb(d: Path, keys: dict = keys, command: str = command) -> Case:
                path = str(suite(d, **keys))
                args = ["suites", "validate", path] if command == "validate" else ["eval", "--suite", path]
                return Case(args, "YAML nodes")

            yield f"alias bomb in {where}: {command}", judged(bomb)

    def group_bomb(d: Path) -> Case:
        return Case(["suites", "validate", str(group(d, body=f"{BOMB_ANCHORS}group: g\nsuites: {BOMB}\n"))],
                    "YAML nodes")  # fmt: skip

    yield "alias bomb in a group's suites", judged(group_bomb)
    yield (
        "a cyclic alias",
        judged(lambda d: Case(["suites", "validate", str(_text(d, "a: &a [*a]\n"))], "cycle")),
    )
    for special in ("fifo", "/dev/zero"):
        for command in ("validate", "eval"):

            def device(d: Path, special: str = special, command: str = command) -> Case:
                path = special
                if special == "fifo":
                    os.mkfifo(d / "s.yaml")
                    path = str(d / "s.yaml")
                args = ["suites", "validate", path] if command == "validate" else ["eval", "--suite", path]
                return Case(args, "not a regular file")

            yield f"a {special} as a suite file: {command}", judged(device)
    graders = {
        "a SyntaxError": ("def grade(:\n", "SyntaxError"),
        "raising at import": ("raise RuntimeError('boom')\n", "RuntimeError"),
        "sys.exit(0) at import": ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
        "a relative name": (None, "absolute module name"),
    }
    for what, (module, said) in graders.items():

        def grader(d: Path, module: str | None = module, said: str = said) -> Case:
            name = "drill_grader" if module else ".rel"
            if module:
                (d / "drill_grader.py").write_text(module)
            return Case(["suites", "validate", str(suite(d, grader=f"python:{name}:grade"))], said)

        yield f"grader module with {what}", judged(grader)
    for key, value in (("temperature", float("nan")), ("temperature", -1), ("top_p", 7), ("samples", 0),
                       ("samples", 10**6), ("max_tokens", 2**62)):  # fmt: skip

        def sampling(d: Path, key: str = key, value: object = value) -> Case:
            text = str(suite(d, sampling={key: value})).replace("NaN", ".nan")
            path = Path(text)
            path.write_text(path.read_text().replace("NaN", ".nan"))
            return Case(["suites", "validate", text], f"sampling.{key}")

        yield f"sampling {key} {value!r}", judged(sampling)

    def title(d: Path) -> Case:
        suite(d / "mine", title="\x1b]0;pwned\x07\x1b[2J")
        return Case(["suites", "--include-path", str(d / "mine")], "pwned", refuse=False)

    yield "a suite title with terminal control bytes", judged(title)


def _text(d: Path, text: str) -> Path:
    (d / "s.yaml").write_text(text)
    return d / "s.yaml"


# ---- 3. length logs, verl and TRL imports ----------------------------------------------------------------


def imports(work: Path) -> Iterator[tuple[str, Check]]:
    for special in ("fifo", "/dev/zero"):
        for args in (["import", "lengths"], ["import", "verl"], ["simulate", "--trace"], ["audit"]):

            def device(d: Path, special: str = special, args: list = args) -> Case:
                path = special
                if special == "fifo":
                    os.mkfifo(d / "log.jsonl")
                    path = "log.jsonl"
                extra = ["--out", "o"] if args[0] != "audit" else []
                return Case([*args, path, *extra], "not a regular file")

            yield f"a {special} for {' '.join(args)}", judged(device)
    values = (("prompt_tokens", 2**63), ("prompt_tokens", 10**400), ("step", 2**63), ("step", 10**400),
              ("worker", 2**40))  # fmt: skip
    for key, value in values:
        what = f"{key} {'10^400' if value == 10**400 else f'2^{value.bit_length() - 1}'}"

        def bad_value(d: Path, key: str = key, value: int = value) -> Case:
            row = {"step": 0, "group": "a", "response_tokens": [3, 5], key: value}
            log = length_log(d / "log.jsonl", [{"step": 0, "group": "b", "response_tokens": [2]}, row])
            return Case(["import", "lengths", str(log), "--out", "o"], f"log.jsonl:2: {key} is")

        yield f"length log {what}", judged(bad_value)

    def simulate_value(d: Path) -> Case:  # a length trace for simulate: int64 overflow deep in numpy
        row = {"step": 0, "prompt_id": "a", "sample": 0, "prompt_tokens": 10**400, "response_tokens": 5}
        log = length_log(d / "trace.jsonl", [row])
        return Case(["simulate", "--trace", str(log), "--workers", "1", "--out", "o"], "prompt_tokens is")

    yield "simulate --trace with prompt_tokens 10^400", judged(simulate_value)
    for what, change in (("timing_s/gen 1e308", {"timing_s/gen": 1e308}), ("step 10^400", "step")):

        def verl_value(d: Path, change: dict | str = change) -> Case:
            row = {"step": 1, "data": {"timing_s/gen": 3.0, "timing_s/step": 5.0}}
            row = {**row, "step": 10**400} if change == "step" else {**row, "data": {**row["data"], **change}}
            log = length_log(d / "verl.jsonl", [row])
            return Case(["import", "verl", str(log), "--out", "o"], "verl.jsonl:1:")

        yield f"a verl log with {what}", judged(verl_value)

    def workers(d: Path) -> Case:  # a 1 MB log naming 20,000 workers in one step: 5.5 GB
        rows = (
            {"step": 0, "group": f"g{w}", "response_tokens": [1 + w % 9], "worker": w} for w in range(20000)
        )
        log = length_log(d / "log.jsonl", rows)
        return Case(["import", "lengths", str(log), "--out", "o"], "workers so far")

    yield "a length log naming 20,000 workers in one step", judged(workers)

    def slots(d: Path) -> Case:
        log = length_log(d / "log.jsonl", [{"step": 0, "group": "a", "response_tokens": [3, 5]}])
        return Case(["import", "lengths", str(log), "--slots", "2147483647", "--workers", "1", "--out", "o"],
                    "report:", refuse=False)  # fmt: skip

    yield "import lengths --slots 2147483647", judged(slots)

    def one_sample_steps(d: Path) -> Case:  # had not finished after 300 s
        rows = ({"step": s, "group": "q", "response_tokens": [1 + s % 50]} for s in range(200_000))
        return Case(["import", "lengths", str(length_log(d / "log.jsonl", rows)), "--out", "o"],
                    "at most 100,000")  # fmt: skip

    yield "a length log of 200,000 one-sample steps", judged(one_sample_steps)

    def million_lines(d: Path) -> Case:  # 4.2-5.6 GB
        rows = ({"step": i // 100, "group": f"q{i % 100}", "prompt_tokens": 100,
                 "response_tokens": [1 + (i * k * 7919) % 2000 for k in range(1, 5)]}
                for i in range(1_000_000))  # fmt: skip
        log = length_log(d / "log.jsonl", rows)
        return Case(["import", "lengths", str(log), "--out", "o"], "report:", refuse=False, rss=1 << 30,
                    timeout=900)  # fmt: skip

    yield "a 1,000,000-line length log within 1 GB", judged(million_lines)

    def wide_line(d: Path) -> Case:  # one line parsed whole: 1.0 GB for 20,000,000 samples
        log = length_log(d / "log.jsonl", [], raw='{"step": 0, "group": "a", "response_tokens": [' +
                         ",".join(["1000"] * 20_000_000) + "]}\n")  # fmt: skip
        return Case(["import", "lengths", str(log), "--out", "o"], "a line longer than", rss=256 << 20)

    yield "a length log line of 20,000,000 samples", judged(wide_line)

    def hostile_name(d: Path) -> Case:  # a file name that would clear the screen and set the window title
        log = length_log(
            d / "log\x1b[2J\x1b]0;pwned\x07.jsonl", [{"step": 0, "group": "a", "response_tokens": [3]}]
        )
        # an OSC title, not a colour: click strips CSI sequences itself when the output is not a terminal
        return Case(["trace", "convert", str(log), "--out", "t\x1b]0;pwned\x07.jsonl"], "wrote", refuse=False)

    yield "trace convert of a file named with escape bytes", judged(hostile_name)

    def parquet_rows(d: Path) -> Case:  # a 233 kB parquet of 20M rows: 4.9 GB
        import pyarrow as pa
        import pyarrow.parquet as pq

        (d / "trl" / "completions").mkdir(parents=True)
        n = 20_000_000
        columns = {"step": pa.repeat(1, n), "prompt": pa.repeat("p", n), "completion_tokens": pa.repeat(5, n)}
        table = pa.table(columns)
        pq.write_table(table, d / "trl" / "completions" / "completions_00001.parquet", compression="zstd")
        return Case(["import", "trl", "trl", "--out", "o"], "20,000,000 rows")

    yield "a completions parquet of 20,000,000 rows", judged(parquet_rows)


# ---- 4. modes and observations ---------------------------------------------------------------------------


def modes_and_samples(work: Path) -> Iterator[tuple[str, Check]]:
    def lookahead(d: Path) -> Case:
        model = write_tiny_model(d / "model")
        args = ["train", "--mode", "sorted+lookahead", "--mode-option", "oversubscription=1e308", "--model",
                str(model), "--steps", "1", "--out", "run"]  # fmt: skip
        return Case(args, "oversubscription must be within")

    yield "train --mode sorted+lookahead --mode-option oversubscription=1e308", judged(lookahead)

    def suffix(d: Path) -> Case:
        model = write_tiny_model(d / "model")
        return Case(["train", "--mode", "suffix", "--model", str(model), "--steps", "1", "--out", "run"],
                    "&& pip install --no-build-isolation")  # fmt: skip

    try:
        import arctic_inference  # noqa: F401
    except ImportError:  # the case is about its absence
        yield "train --mode suffix without arctic-inference", judged(suffix)

    def empty_samples(d: Path) -> Case:
        (d / "obs").mkdir()
        (d / "obs" / "samples.jsonl").write_text("")
        return Case(["observe", "--from-samples", "obs"], "no samples")

    yield "observe --from-samples with an empty samples.jsonl", judged(empty_samples)

    def calibrate_missing(d: Path) -> Case:  # checked only after --out was claimed (created)
        args = ["simulate", "--synthetic", "--calibrate", "MISSING", "--steps", "1", "--prompts", "2"]
        args += ["--workers", "1", "--out", "o"]
        return Case(args, "MISSING", outside=(d,))

    yield "simulate --calibrate MISSING", judged(calibrate_missing)

    def oversubscribed(d: Path) -> Case:  # 5.7 GB, then a MemoryError
        args = ["simulate", "--modes", "sorted+async:oversubscription=1000000", "--out", "o"]
        return Case(args, "GiB to replay; this machine has", rss=256 << 20, outside=(d,))

    yield "simulate --modes sorted+async:oversubscription=1000000", judged(oversubscribed)


def surfaces(work: Path) -> Iterator[tuple[str, Check]]:
    for family in (trl_callback, suite_files, imports, modes_and_samples):
        yield from family(work)


if __name__ == "__main__":  # one case by name, for a look at what it prints
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in surfaces(Path(tmp)):
            if sys.argv[1] in name:
                (Path(tmp) / "case").mkdir(exist_ok=True)
                print(name, vars(check(Path(tmp) / "case")))
