"""Other frameworks' per-sample files as open rollout traces (reference_trainer/trace/rollout_trace.py).

`to_records(path)` recognises what `path` is (`kind`) and converts it; docs/integrations.md ("The open
rollout trace", "slime") says what is read from each. slime's `.pt` is loaded with `weights_only=True`; a
file that needs more is refused unless `trust_pickle` says its source is trusted, because unpickling it can
run any code the file holds.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_trainer.errors import UserError
from reference_trainer.trace import rollout_trace
from reference_trainer.trace.records import read_jsonl
from reference_trainer.trace.rollout_trace import Record, prompt_hash, record
from reference_trainer.trace.schema import MAX_MAGNITUDE, is_number, read_trace
from rlbench.integrations import lengthlog, trl_logs, verl
from rlbench.integrations.lengthlog import Group

PICKLE_RISK = (
    "{path}: this .pt needs a full unpickle (weights_only=False), which can run any code the file holds; "
    "pass --trust-pickle if you trust where it came from"
)
SLIME_STATUS = {
    "completed": ("finished", "stop"),
    "truncated": ("finished", "length"),
    "aborted": ("aborted", "abort"),
    "failed": ("aborted", "failed"),
    "pending": ("aborted", None),
}


def from_groups(groups: list[Group], source: str, hashed: bool) -> list[Record]:
    """One record per sample of each group, without times. `hashed`: the group names are already hashes
    of the prompt text (verl's and TRL's readers name groups so)."""
    return [
        record(
            source=source,
            step=g.step,
            request_id=f"{g.step}-{j}-{k}",
            prompt_hash=g.group if hashed else prompt_hash(g.group),
            group=g.group,
            sample=k,
            engine=g.worker,
            prompt_tokens=g.prompt_tokens or None,
            response_tokens=n,
            status="finished",
            time_source="none",
        )
        for j, g in enumerate(groups)
        for k, n in enumerate(g.lengths)
    ]


def to_groups(records: list[Record]) -> list[Group]:
    """The records' response lengths as length-log groups (step, group, engine), in record order."""
    order: dict[tuple[int, str, Any], list[int]] = {}
    for r in records:
        order.setdefault((r["step"], r["group"], r.get("engine")), []).append(max(1, r["response_tokens"]))
    return [
        Group(step, group, tuple(lengths), worker=engine if type(engine) is int else 0)
        for (step, group, engine), lengths in order.items()
    ]


def _slime(path: Path, trust_pickle: bool) -> list[Record]:
    import torch

    try:
        doc = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError:
        raise UserError(PICKLE_RISK.format(path=path)) from None
    except (OSError, RuntimeError, EOFError, ValueError) as err:  # a 0-byte file's error has no message
        why = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{path}: not a torch file ({why})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise UserError(f"{path}: no 'samples' list (not slime's --save-debug-rollout-data file)")
    step = doc.get("rollout_id") if type(doc.get("rollout_id")) is int else 0
    spans = [_generate_span(s) for s in doc["samples"]]
    t0 = min((a for a, _ in spans if a is not None), default=0.0)
    out = []
    for n, (s, (start, end)) in enumerate(zip(doc["samples"], spans, strict=True)):
        if not isinstance(s, dict) or type(s.get("response_length")) is not int:
            raise UserError(f"{path}: sample {n} has no response_length (not a slime Sample)")
        status, reason = SLIME_STATUS.get(str(s.get("status")), ("finished", None))
        spec = s.get("spec_info") if isinstance(s.get("spec_info"), dict) else {}
        tokens = s.get("tokens")
        out.append(
            record(
                source="slime",
                step=step,
                request_id=str(s.get("index", n)),
                prompt_hash=prompt_hash(s.get("prompt")),
                group=str(s.get("group_index")),
                sample=None,
                prompt_tokens=len(tokens) - s["response_length"]
                if isinstance(tokens, list) and len(tokens) >= s["response_length"]
                else None,
                response_tokens=s["response_length"],
                status=status,
                finish_reason=reason,
                t_admit=None if start is None else start - t0,
                t_finish=None if end is None else end - t0,
                t_abort=end - t0 if status == "aborted" and end is not None else None,
                policy_versions=rollout_trace.spans(s.get("weight_versions") or None),
                drafted=spec.get("spec_draft_token_num") or None,
                accepted=spec.get("spec_accept_token_num") or None,
                time_source="measured" if start is not None and end is not None else "none",
            )
        )
    for r in out:  # slime records a version per turn, not per token
        for span in r["policy_versions"] or []:
            span["tokens"] = None
    return out


def _generate_span(sample: Any) -> tuple[float | None, float | None]:
    """The first sglang_generate span's start and the last one's end in a slime sample's trace. Events that
    are not objects with a finite numeric `ts` within MAX_MAGNITUDE are not times and are left out."""
    trace = sample.get("trace") if isinstance(sample, dict) else None
    events = trace.get("events") if isinstance(trace, dict) else None
    events = events if isinstance(events, list) else []
    timed = [e for e in events if isinstance(e, dict) and e.get("name") == "sglang_generate"
             and is_number(e.get("ts")) and abs(e["ts"]) <= MAX_MAGNITUDE]  # fmt: skip
    starts = [e["ts"] for e in timed if e.get("type") == "span_start"]
    ends = [e["ts"] for e in timed if e.get("type") == "span_end"]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def _jsonl(path: Path) -> list[Record]:
    first = next(iter(read_jsonl(path, torn_tail=False)), None)
    if first is None:
        raise UserError(f"{path}: no lines")
    if first.get("schema") == rollout_trace.SCHEMA_ID:
        return rollout_trace.read(path)
    if "response_tokens" in first and "group" in first:
        return from_groups(lengthlog.read(path), "length log", hashed=False)
    if {"input", "output"} <= set(first):  # one of verl's {step}.jsonl dumps, given alone
        raise UserError(
            f"{path}: one of verl's rollout dumps: give their folder ({path.parent}) and the run's "
            "tokenizer, --tokenizer DIR (the dumps hold texts, not token counts)"
        )
    raise UserError(f"{path}: neither an open rollout trace nor a length log (see docs/integrations.md)")


def kind(path: Path) -> str:
    """What `path` is, by its shape: rlbench, trl, verl-dumps, slime, jsonl."""
    if path.is_dir():
        if (path / "trace.jsonl").is_file():
            return "rlbench"
        if (path / "completions").is_dir():
            return "trl"
        if any(p.stem.isdigit() for p in path.glob("*.jsonl")):
            return "verl-dumps"
        raise UserError(
            f"{path}: a directory, but not an rlbench run, TRL's output_dir or verl's rollout dumps"
        )
    if path.suffix == ".pt":
        return "slime"
    if not path.exists():  # one that exists is read as a regular file (records.read_jsonl says why not)
        raise UserError(f"{path}: no such file")
    return "jsonl"


def to_records(
    path: Path, tokenizer: Callable[[], Any] | None = None, trust_pickle: bool = False
) -> list[Record]:
    """`path` as open rollout-trace records (see the module docstring); `tokenizer` loads the run's
    tokenizer where texts must be counted."""
    found = kind(path)
    if found == "rlbench":
        return rollout_trace.from_events(read_trace(path / "trace.jsonl"))
    if found == "trl":
        groups = trl_logs.read_completions(path / "completions", tokenizer() if tokenizer else None)
        return from_groups(groups, "TRL", hashed=True)
    if found == "verl-dumps":
        if tokenizer is None:
            raise UserError(
                f"{path}: verl's rollout dumps hold texts, not token counts: pass the run's tokenizer "
                "folder, --tokenizer DIR"
            )
        return from_groups(verl.read_rollout_dir(path, tokenizer()), "verl", hashed=True)
    if found == "slime":
        return _slime(path, trust_pickle)
    return _jsonl(path)
