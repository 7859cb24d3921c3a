"""Admissions ride in decode steps (issue 57): exact, one prefill of its own per burst at most, every graph
shape a run takes prepared before its first step, and a compare's flex compiles bounded."""

from __future__ import annotations

import collections
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_engine import GREEDY, prompts

from reference_trainer.engine import kv_cache
from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.graphs import StaticForward
from reference_trainer.engine.sampler import SamplerOps
from reference_trainer.engine.sequence import Request
from reference_trainer.model import loader
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.model.embedded import default_model_dir
from reference_trainer.model.loader import load_model, read_config
from reference_trainer.model.tokenizer import CharTokenizer
from reference_trainer.modes import get_mode
from reference_trainer.tasks import get_task
from reference_trainer.train import assemble as assemble_module
from reference_trainer.train import heldout
from reference_trainer.train.assemble import assemble
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.heldout import HeldOut
from reference_trainer.train.trainer import Trainer


def arrivals(engine: Engine, batch: list[list[int]], every: int = 1) -> list:
    """`batch`'s requests arriving one every `every` steps, mid-flight, run to the end."""
    seqs, pending, step = [], list(batch), 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            seqs.append(engine.add_request(Request(pending.pop(0), GREEDY)))
        engine.step()
        step += 1
    return seqs


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("attention", ["matmul", "sdpa"])
def test_admissions_riding_in_decode_steps_change_no_token(llama_dir, layout, attention, monkeypatch):
    """Requests admitted into a running batch ride in its decode step (one forward over both): each
    emits exactly the tokens it emits alone; the trace has one prefill of its own (the first arrival, while
    nothing ran) and decode steps that carried the rest."""
    monkeypatch.setattr(kv_cache, "CONTIGUOUS_KV_BYTES", 2**62 if layout == "contiguous" else 0)
    model = load_model(llama_dir)
    batch = prompts(10, seed=11)
    config = EngineConfig(max_num_seqs=4, max_model_len=128, attention=attention)
    alone = [Engine(model, config, eos_token_ids=[2]).generate([p], GREEDY)[0].response_ids for p in batch]
    engine = Engine(model, config, eos_token_ids=[2])
    assert engine.slots.contiguous == (layout == "contiguous")
    seqs = arrivals(engine, batch, every=3)
    assert [s.response_ids for s in seqs] == alone
    steps = [e for e in engine.trace.events if e["kind"] in ("prefill", "decode")]
    assert [e["kind"] for e in steps].count("prefill") == 1 and steps[0]["kind"] == "prefill"
    riding = [e for e in steps if e.get("prefill_rows")]
    assert sum(e["prefill_rows"] for e in riding) == len(batch) - 1
    for e in riding:  # the step's rows: the running ones and the admitted; tokens fed: one each + prompts
        assert (
            e["rows"] == e["tokens"]
            and e["input_tokens"] == e["rows"] - e["prefill_rows"] + e["prefill_tokens"]
        )


def test_a_sorted_step_runs_one_prefill_of_its_own(tiny_model_dir, tmp_path):
    """SortedRL refills freed slots all step long: those admissions ride in decode steps, so a step runs
    one prefill of its own (its first admissions, into an empty engine) however many refills it makes."""
    config = TrainConfig(
        mode="sorted", model=str(tiny_model_dir), steps=2, prompts_per_step=4, group_size=4, max_num_seqs=8,
        max_tokens=24, max_model_len=256, eval_every=0, temperature=1.0,
    )  # fmt: skip
    trainer = Trainer(config, tmp_path / "run")
    for _ in range(2):
        trainer.train_step()
    forwards = collections.Counter(
        (e["step"], e["kind"]) for e in trainer.trace.events if e["kind"] in ("prefill", "decode")
    )
    refills = collections.Counter(e["step"] for e in trainer.trace.events if e.get("prefill_rows"))
    for step in (0, 1):
        assert forwards[step, "prefill"] == 1 and refills[step] > 0


def static_engine(model_dir: Path, mode: str, attention: str = "matmul") -> Trainer:
    """A trainer whose engine runs the static-shape forward a GPU replays (here eagerly, capture=False), so
    the shapes its steps take can be held to those prepared before step 0."""
    config = TrainConfig(
        mode=mode, model=str(model_dir), steps=2, prompts_per_step=2, group_size=3, max_num_seqs=8,
        max_tokens=24, max_model_len=256, eval_every=0, temperature=1.0,
        mode_options={"spec": {"cost_model": [[1, 1, 1.0], [8, 1, 1.0], [1, 16, 1.0], [8, 16, 1.0]]}}
        if get_mode(mode).speculative else {},
    )  # fmt: skip
    parts = assemble(config)
    engine = parts.engine
    assert isinstance(engine, Engine)
    engine.runner.static = StaticForward.eager(engine, attention)
    return Trainer(config, model_dir.parent / f"run-{mode}", parts=parts)


@pytest.mark.parametrize("mode", ["baseline", "sorted", "rhyme"])
def test_every_shape_a_run_takes_is_prepared_before_its_first_step(tiny_model_dir, mode):
    trainer = static_engine(tiny_model_dir, mode)
    static = trainer.engine.runner.static  # type: ignore[attr-defined]
    events = trainer.trace.events
    assert [e["kind"] for e in events] == ["capture"] and static.prepared and not static.ran
    for _ in range(2):
        trainer.train_step()
    assert static.ran and static.ran <= static.prepared, sorted(static.ran - static.prepared)
    # an admitting step's decode part runs at a prepared decode shape: on CUDA its flex shape is compiled
    admitting = trainer.engine.runner.admitting  # type: ignore[attr-defined]
    decode_parts = {(bucket, 1, span) for bucket, _, _, span, _ in admitting.ran}
    assert decode_parts <= {(b, w, s) for b, w, s, _ in static.prepared}, decode_parts
    if mode == "sorted":
        assert admitting.ran  # its refills rode in decode steps on the static path
    if mode == "rhyme":
        assert any(width > 1 for _, width, _, _ in static.ran)  # verify shapes ran, prepared too


def flex_keys(model: DecoderLM, config: EngineConfig, temperature: float, verify: bool) -> set:
    """The compiled flex shapes (graphs.py `compile_keys`) an engine of `config` over `model` prepares on a
    GPU: the paged pool preallocated as under graphs, flex attention, the run's sampling."""
    shape = model.config
    max_len = min(config.max_model_len, shape.max_position_embeddings) + config.max_verify_tokens
    slots = kv_cache.SlotManager(
        shape, config.max_num_seqs, max_len, torch.device("meta"), torch.bfloat16, contiguous=False,
        preallocate=True,
    )  # fmt: skip
    static = StaticForward(model, slots, config.max_verify_tokens, False, "flex")
    static.prepare(SamplerOps.of([SamplingParams(temperature=temperature)]), verify=verify)
    return static.compile_keys()


def test_a_compare_with_its_held_out_evaluation_compiles_at_most_12_flex_shapes(monkeypatch):
    """The README's compare on a GPU (the embedded model, the run's defaults, flex attention): the compiled
    flex shapes of its rollout engines and of the held-out evaluation's engine (built by train/heldout.py as
    on CUDA: its dtype as resolved there), counted from their shape keys, dtype included; verify runs SDPA
    (no compile), decode one span per batch bucket. The held-out engine adds none: it runs the rollout's
    dtype at the rollout's sizes (an fp32 copy at other sizes added 8)."""
    defaults = TrainConfig()
    cuda_dtype = loader.resolve_dtype("auto", torch.device("cuda"))
    keys = set()
    for mode in ("baseline", "sorted", "rhyme"):
        with torch.device("meta"):  # the rollout's copy, in the inference dtype (rollout/engines.py)
            model = DecoderLM(read_config(default_model_dir())).to(cuda_dtype)
        # the rollout engine's config as train/assemble.py builds it (its sizes: no speculation in them)
        config = assemble_module._engine_spec(defaults, SimpleNamespace(speculation=None), "cuda").config
        keys |= flex_keys(model, config, defaults.temperature, get_mode(mode).speculative)
    monkeypatch.setattr(heldout, "resolve_dtype", lambda dtype, device: cuda_dtype)  # as on a CUDA device
    with torch.device("meta"):
        policy = DecoderLM(read_config(default_model_dir()))  # the trained policy: fp32
    tokenizer, task = CharTokenizer(), get_task("arith")
    held = HeldOut(
        policy,
        tokenizer,
        task,
        task.problems(2, seed=1),
        defaults.response_tokens,
        defaults.max_model_len,
        defaults.max_num_seqs,
    )  # fmt: skip (as trainer.py builds it)
    held_keys = flex_keys(held.engine.model, held.engine.config, 0.0, verify=False)
    assert held_keys <= keys, sorted(held_keys - keys)
    assert 0 < len(keys | held_keys) <= 12, sorted(keys | held_keys)


def test_the_admission_overhead_is_measured_through_the_runner(llama_dir):
    """What the gate waits out on a GPU, measured here on the eager path: finite, per batch, and the gate
    built from it admits once the idle slot-steps pay for it."""
    engine = Engine(load_model(llama_dir), EngineConfig(max_num_seqs=9, max_model_len=128), eos_token_ids=[2])
    table = engine.measure_admission_overhead(batches=(1, 8), tokens=16, repeats=1)
    assert set(table) == {1, 8} and all(0 <= k < 1e3 for k in table.values())
    assert not engine.scheduler.running and engine.slots.num_free == 9  # the probes gave their slots back
