"""Lookahead (BubbleSpec/SRT): the next step's requests run in the bubble and draft for themselves after the
update. Exact (statistically and token for token), it fills idle slots without being trained on, the second
step drafts from the first step's lookahead runs, and it passes the cost gate as every drafter does."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli, peaked_model
from scipy import stats

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.engine import Engine
from reference_trainer.engine.sampler import coupled_accept
from reference_trainer.engine.sequence import Request, Sequence
from reference_trainer.model.decoder import DecoderLM
from reference_trainer.modes import MODES, get_mode
from reference_trainer.rollout.base import EngineFill, Lookahead
from reference_trainer.rollout.multi import MultiEngine
from reference_trainer.rollout.workers import WorkerLost
from reference_trainer.speculation.cost import ForwardCosts
from reference_trainer.speculation.drafters import DRAFTERS, attach
from reference_trainer.speculation.lookahead import LookaheadDrafter, LookaheadOptions
from reference_trainer.speculation.speculator import Speculator
from reference_trainer.trace.metrics import step_metrics
from reference_trainer.train.config import TrainConfig
from reference_trainer.train.trainer import Trainer
from rlbench.reproduce.lossless import homogeneity_test, sample_responses
from rlbench.simulate import workload
from rlbench.simulate.cost import preset
from rlbench.simulate.modes import SIM_MODES
from rlbench.simulate.scheduler import simulate_mode

PROMPT = [5, 6, 7, 8]
EOS = 2
FREE = ForwardCosts(
    {(1, 1): 1.0, (64, 1): 1.0, (1, 16): 1.0, (64, 16): 1.0}
)  # rows and verifies cost nothing
# A CPU's shape: a decode step's time grows with its rows, a verify of q tokens costs about q decode steps.
CPU = ForwardCosts({(b, q): 1e-3 * (1 + 0.1 * b) * q for b in (1, 4, 16, 64) for q in (1, 2, 4, 8, 16)})
LOOKAHEAD_MODES = ("lookahead", "sorted+lookahead", "rhyme+lookahead")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Matrices this small run faster on one thread, and far faster on a machine whose cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    return peaked_model()


@pytest.fixture(scope="module")
def old(model: DecoderLM) -> DecoderLM:
    """The weights before an update: the model, moved a little."""
    torch.manual_seed(1)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return m.eval()


def engine_of(model: DecoderLM) -> Engine:
    return Engine(model, EngineConfig(max_num_seqs=64, max_model_len=96), eos_token_ids=[EOS])


def sampling(first_seed: int, n: int, max_tokens: int = 12) -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=first_seed + j) for j in range(n)]


def lookahead_runs(old: DecoderLM, params: list[SamplingParams], steps: int) -> list[Sequence]:
    """What a bubble leaves: the requests run ahead under the old weights for `steps` engine steps."""
    engine = engine_of(old)
    seqs = [
        engine.add_request(Request(PROMPT, p, seq_id=f"ahead-{i}", lookahead=True))
        for i, p in enumerate(params)
    ]
    for _ in range(steps):
        engine.step()
    return [engine.abort(s) for s in seqs]


def with_lookahead(model, old, params, rule=coupled_accept, steps=9, cost=FREE):
    """The requests under `model`, drafting from their lookahead runs under `old`: sequences, verifies."""
    engine = engine_of(model)
    spec = attach(engine, {"drafter": "lookahead"}, accept_rule=rule, cost_model=cost)
    for run in lookahead_runs(old, params, steps):
        spec.drafter.on_done(run, 0)
    out = engine.generate([PROMPT] * len(params), params)
    return out, [e for e in engine.trace.events if e["kind"] == "verify"]


# ---- exactness ---------------------------------------------------------------------------------------------


def test_lookahead_drafts_leave_the_sampling_distribution_unchanged(model, old):
    """The lossless test of test_speculative.py on real lookahead drafts (same seeds, older weights). Its
    power check (a wrong rule is caught) runs there on the lookahead drafter too (DRAFTERS); here the drafts
    are so close to the target that min(1, 2 p(d)) barely moves the distribution."""
    n = 300
    plain = sample_responses(model, [PROMPT], n, 0, [EOS], 12).responses[0]

    def drafted(rule):
        out, verify = with_lookahead(model, old, sampling(10_000, n), rule)
        assert sum(e["accepted"] for e in verify) > 100  # the drafts really were used
        responses = [tuple(s.response_ids) for s in out]
        chi = homogeneity_test([[s[:4] for s in plain]], [[s[:4] for s in responses]])["p_value"]
        return chi, stats.ks_2samp([len(s) for s in plain], [len(s) for s in responses]).pvalue

    assert min(drafted(coupled_accept)) > 0.01


def test_seeded_outputs_are_plain_decoding_s_and_the_coupling_accepts_what_the_weights_kept(model, old):
    params = sampling(500, 16, max_tokens=20)
    plain = [s.response_ids for s in engine_of(model).generate([PROMPT] * 16, params)]
    same, verify_same = with_lookahead(model, model, params)  # no update between: every draft token holds
    moved, verify_moved = with_lookahead(model, old, params)
    assert [s.response_ids for s in same] == [s.response_ids for s in moved] == plain
    drafted = sum(e["drafted"] for e in verify_same)
    assert drafted > 0 and sum(e["accepted"] for e in verify_same) == drafted
    drafted, accepted = sum(e["drafted"] for e in verify_moved), sum(e["accepted"] for e in verify_moved)
    assert 0 < accepted < drafted  # moved weights: some draws differ, the rest of such a draft is dropped


def test_a_draft_ends_at_its_first_mismatch_and_goes_with_its_request():
    drafter = LookaheadDrafter(options=LookaheadOptions(max_draft=3))
    params = SamplingParams(seed=7)
    ahead = Sequence("lookahead:p/0", PROMPT, params, response_ids=[10, 11, 12, 13, 14], lookahead=True)
    drafter.on_done(ahead, 0)
    assert drafter.draft(ahead, 8) == []  # a lookahead run never drafts
    seq = Sequence("p/0", PROMPT, params)
    assert drafter.draft(seq, 8) == [10, 11, 12]  # max_draft
    assert drafter.draft(Sequence("p/1", PROMPT, SamplingParams(seed=8)), 8) == []  # another seed
    seq.response_ids += [10, 11]
    assert drafter.draft(seq, 1) == [12]
    seq.response_ids += [99]  # the verifier drew another token: the rest followed a token not drawn
    assert drafter.draft(seq, 8) == []
    drafter.on_done(seq, 0)
    assert not drafter.drafts  # memory: a draft goes with its request


# ---- in the trainer ----------------------------------------------------------------------------------------


AHEAD = "lookahead:"  # a lookahead run's id in the trace: this and the id of the request it runs ahead of


def train(
    tmp: Path,
    model_dir: Path,
    mode: str,
    steps: int = 2,
    cost: list | None = None,
    workers: int = 1,
    run: str | None = None,
    **options,
):
    spec = get_mode(mode).speculative
    config = TrainConfig(
        workers=workers,
        worker_backend="local",
        eval_every=0,
        mode=mode,
        model=str(model_dir),
        steps=steps,
        prompts_per_step=2,
        group_size=3,
        max_tokens=24,
        max_num_seqs=8,
        max_model_len=256,
        prompt_pool=4,
        temperature=1.0,
        mode_options={
            **options,
            **(
                {"spec": {"cost_model": cost or [[b, q, 1.0] for b in (1, 64) for q in (1, 16)]}}
                if spec
                else {}
            ),
        },
    )
    if run is not None:  # a run resumed (made on any worker count) or to be resumed
        config.checkpoint_every = 1
        return Trainer(config, tmp / run, resume=(tmp / run / "train_config.json").exists())
    return Trainer(config, tmp / f"{mode}-w{workers}")


def finished(trainer: Trainer) -> list[tuple[tuple[int, str], int]]:
    """((step, request id), response tokens) of the trained samples."""
    return [
        ((e["step"], e["id"]), e["response_tokens"])
        for e in trainer.trace.events
        if e["kind"] == "sequence" and e["status"] == "finished"
    ]


@pytest.mark.parametrize(
    ("mode", "plain", "options"),
    [("lookahead", "baseline", {}), ("sorted+lookahead", "sorted", {"oversubscription": 1.0})],
)
def test_lookahead_fills_idle_slots_never_trains_its_tokens_and_the_next_step_drafts_from_it(
    tmp_path, tiny_model_dir, mode, plain, options
):
    trainer = train(tmp_path, tiny_model_dir, mode, **options)
    drafter = trainer.engine.speculation.drafter
    assert (
        isinstance(drafter, LookaheadDrafter) and drafter.fallback is None
    )  # drafts come from lookahead only
    runs: dict[str, list[int]] = {}  # lookahead id -> its tokens, as the drafter was handed them
    drafts: list[tuple[str, int, list[int]]] = []  # (request, response length, draft) of every draft made
    on_done, draft = drafter.on_done, drafter.draft

    def spy_done(seq, epoch):
        if seq.lookahead:
            runs[seq.seq_id] = list(seq.response_ids)
        on_done(seq, epoch)

    def spy_draft(seq, limit):
        out = draft(seq, limit)
        if out:
            drafts.append((seq.seq_id, len(seq.response_ids), out))
        return out

    drafter.on_done, drafter.draft = spy_done, spy_draft
    collect = trainer.strategy.collect
    trained: list[str] = []
    trainer.strategy.collect = lambda ctx: [  # type: ignore[method-assign]
        g for g in collect(ctx) if not trained.extend(s.seq_id for s in g.samples)
    ]
    rows = [trainer.train_step() for _ in range(2)]

    events = trainer.trace.events
    step0 = [e for e in events if e.get("step") == 0 and e["kind"] in ("prefill", "decode", "verify")]
    filling = [e for e in step0 if e.get("lookahead_slots")]
    # Lookahead ran while the step's own samples held fewer than all slots: the bubble.
    assert filling and all(e["active_slots"] - e["lookahead_slots"] < e["capacity"] for e in filling)
    m = step_metrics(events)
    assert m[0]["lookahead_tokens"] > 0 and m[0]["lookahead_slot_share"] > 0
    own = 1 - (m[0]["slot_time"] - m[0]["lookahead_slot_time"]) / (m[0]["capacity"] * m[0]["timing_s/gen"])
    assert m[0]["bubble_ratio"] < own  # the bubble the samples left, less what lookahead filled
    assert m[0]["bubble_ratio"] + m[0]["lookahead_slot_share"] == pytest.approx(own)
    # Never trained, never a sample: not in any group, not a finished sequence event, not in the row's counts.
    assert trained and not any(s.startswith(AHEAD) for s in trained)
    assert all(r["samples"] == 6 for r in rows) and rows[0]["sequences"]["lookahead"] > 0
    assert not any(sid.startswith(AHEAD) for (_, sid), _ in finished(trainer))
    assert m[0]["drafted_tokens"] == 0 < m[1]["drafted_tokens"]  # step 0 has no lookahead to draft from
    # Step 1's drafts are step 0's lookahead runs of the same requests, continued where the response is.
    assert drafts and all(d == runs[AHEAD + sid][n : n + len(d)] for sid, n, d in drafts)
    # Exact: each request's sample is the one the mode without lookahead draws for it. The baseline trains
    # on the same requests; SortedRL may pick other groups, since drafts change which finish first.
    base = train(tmp_path, tiny_model_dir, plain, **options)
    base_rows = [base.train_step() for _ in range(2)]
    ours, theirs = dict(finished(trainer)), dict(finished(base))
    assert all(ours[k] == theirs[k] for k in ours.keys() & theirs.keys())
    if plain == "baseline":
        assert finished(base) == finished(trainer)
        assert [r["reward_mean"] for r in base_rows] == [r["reward_mean"] for r in rows]


def test_rhyme_plus_lookahead_drafts_from_lookahead_first_then_history(tmp_path, tiny_model_dir):
    trainer = train(tmp_path, tiny_model_dir, "rhyme+lookahead")
    drafter = trainer.engine.speculation.drafter
    assert isinstance(drafter, LookaheadDrafter) and type(drafter.fallback).__name__ == "HistoryDrafter"
    rows = [trainer.train_step() for _ in range(2)]
    assert rows[0]["lookahead_tokens"] > 0 and rows[1]["drafted_tokens"] > 0
    assert drafter.counts["used"] > 0 and drafter.fallback.stats()["responses"] > 0


# ---- the cost gate -----------------------------------------------------------------------------------------


def test_lookahead_starts_only_where_its_rows_are_free(tmp_path, tiny_model_dir):
    assert Speculator(LookaheadDrafter(), cost_model=FREE).free_rows(2, 6) == 6
    assert Speculator(LookaheadDrafter(), cost_model=CPU).free_rows(2, 6) == 0  # each row 10% dearer
    cpu = [[b, q, t] for (b, q), t in CPU.table.items()]
    trainer = train(tmp_path, tiny_model_dir, "lookahead", cost=cpu)
    rows = [trainer.train_step() for _ in range(2)]
    assert all(r["lookahead_tokens"] == 0 and r["drafted_tokens"] == 0 for r in rows)
    assert "lookahead" not in rows[0]["sequences"]


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_every_drafter_goes_through_the_cost_gate(model, old, drafter):
    """Drafts that a costly verify cannot pay for are not verified: plain decode steps, as without drafts."""
    if drafter == "suffix":
        pytest.importorskip("arctic_inference.suffix_decoding")
    params = sampling(700, 8, max_tokens=16)
    plain = [s.response_ids for s in engine_of(model).generate([PROMPT] * 8, params)]
    for cost, verifies in ((CPU, False), (FREE, True)):
        engine = engine_of(model)
        spec = attach(engine, {"drafter": drafter, "prior_acceptance": 0.5}, cost_model=cost)
        for run in lookahead_runs(old, params, 12):  # drafts for every drafter: runs, or their responses
            spec.drafter.on_done(run, 0) if drafter == "lookahead" else spec.drafter.add_response(
                PROMPT, run.response_ids
            )
        out = engine.generate([PROMPT] * 8, params)
        assert [s.response_ids for s in out] == plain
        assert any(e["kind"] == "verify" for e in engine.trace.events) == verifies


# ---- the registry, the command and the simulator -----------------------------------------------------------


def test_the_modes_are_registered_listed_and_simulated(tmp_path):
    for name in LOOKAHEAD_MODES:
        mode = MODES[name]
        # on W engines under the controller: each engine fills its own bubble (multi.py, base.EngineFill)
        assert mode.lookahead and mode.controlled and mode.speculation_options({}).lookahead
        sim = SIM_MODES[name]
        assert sim.spec and sim.mode == name
        tr = workload.synthetic(steps=2, prompts=8, group_size=4, mean_tokens=400, max_tokens=2000, seed=1)
        acc = np.full(len(tr), 0.7)
        out = simulate_mode(sim, tr, workload.fill_predictions(tr, 0.9), acc, preset("h100", "7b"), 1, 16, 2)
        assert out["mode"] == name and out["draft_len"] > 0  # cost-aware speculation on the H100 model
    assert (
        MODES["sorted+lookahead"].strategy == "sorted" and MODES["rhyme+lookahead"].speculation == "histospec"
    )
    table = cli("modes", tmp=tmp_path).stdout
    for name in LOOKAHEAD_MODES:
        assert any(line.split()[:1] == [name] for line in table.splitlines())
    assert "HistoSpec + lookahead" in table
    with pytest.raises(Exception, match="needs a lookahead mode"):
        get_mode("rhyme").check_options({"spec": {"drafter": "lookahead"}})
    with pytest.raises(Exception, match="use --engine reference"):
        get_mode("lookahead").check_options({}, engine="vllm")


# ---- W engines: each engine fills its own idle slots (rollout/multi.py, rollout/base.py EngineFill) -------


def trained_samples(trainer: Trainer, steps: int = 2) -> tuple[list[dict], list[list[tuple[str, tuple]]]]:
    """`steps` steps' rows, and each step's trained samples as (request id, response token ids)."""
    collect, out = trainer.strategy.collect, []

    def spy(ctx):
        groups = collect(ctx)
        out.append([(s.seq_id, tuple(s.response_ids)) for g in groups for s in g.samples])
        return groups

    trainer.strategy.collect = spy  # type: ignore[method-assign]
    return [trainer.train_step() for _ in range(steps)], out


@pytest.mark.multi_engine
@pytest.mark.parametrize(
    ("mode", "plain", "options"),
    [
        ("lookahead", "baseline", {"dispatch": "group-spread"}),  # a group over both engines
        ("sorted+lookahead", "sorted", {"oversubscription": 1.0}),
        ("rhyme+lookahead", "rhyme", {}),
    ],
)
def test_on_two_engines_lookahead_fills_each_engine_and_trains_the_samples_of_the_mode_without_it(
    tmp_path, tiny_model_dir, mode, plain, options
):
    trainer = train(tmp_path, tiny_model_dir, mode, workers=2, **options)
    assert isinstance(trainer.engine, MultiEngine)
    rows, samples = trained_samples(trainer)
    base = train(tmp_path, tiny_model_dir, plain, workers=2, **options)
    _, base_samples = trained_samples(base)
    # Lossless: exactly the samples, token for token, of the mode without lookahead on two engines.
    assert samples == base_samples and all(len(step) == 6 for step in samples)
    assert not any(sid.startswith(AHEAD) for step in samples for sid, _ in step)
    assert not any(sid.startswith(AHEAD) for (_, sid), _ in finished(trainer))
    # It happened, on both engines, and the next step verified and accepted drafts from it.
    events = trainer.trace.events
    runs = [e for e in events if e["kind"] == "sequence" and e["status"] == "lookahead"]
    assert {e["worker"] for e in runs} == {0, 1} and rows[0]["sequences"]["lookahead"] == sum(
        e["step"] == 0 for e in runs
    )
    assert rows[0]["lookahead_tokens"] > 0 and rows[1]["accepted_tokens"] > 0
    assert {e["worker"] for e in events if e["kind"] == "decode" and e.get("lookahead_slots")} == {0, 1}
    if plain != "sorted":  # every real token is trained: none of a run's (one may end in any forward) counts
        forwards = [e for e in events if e["kind"] in ("prefill", "decode", "verify")]
        assert sum(e["tokens"] for e in forwards) == sum(len(r) for step in samples for _, r in step)
    if mode == "lookahead":  # a group spread over both engines: some drafts went to the other engine
        ran_on = {e["id"]: e["worker"] for e in runs if e["step"] == 0}
        done = [e for e in events if e["kind"] == "sequence" and e["step"] == 1 and e["status"] == "finished"]
        assert any(e["accepted"] and ran_on.get(AHEAD + e["id"], e["worker"]) != e["worker"] for e in done)


@pytest.mark.multi_engine
def test_on_two_engines_each_engine_s_cost_gate_holds_its_lookahead_back(tmp_path, tiny_model_dir):
    cpu = [[b, q, t] for (b, q), t in CPU.table.items()]
    row = train(tmp_path, tiny_model_dir, "lookahead", cost=cpu, workers=2).train_step()
    assert row["lookahead_tokens"] == 0 and "lookahead" not in row["sequences"]


@pytest.mark.multi_engine
@pytest.mark.parametrize("mode", ["lookahead", "sorted+lookahead"])
def test_an_engine_lost_while_it_runs_ahead_loses_no_sample(tmp_path, tiny_model_dir, mode):
    """Three engines, engine 0 lost at the first slice it starts holding lookahead runs: the step finishes on
    the others and both steps train the samples, token for token, of the mode without lookahead (the runs
    and drafts lost with it are only drafts); no lookahead run is trained or made twice."""
    plain = {"lookahead": "baseline", "sorted+lookahead": "sorted"}[mode]
    options = {"dispatch": "round-robin"} | ({"oversubscription": 1.0} if plain == "sorted" else {})
    trainer = train(tmp_path, tiny_model_dir, mode, workers=3, **options)
    worker = trainer.engine.pool.workers[0]
    real = worker.advance

    def dies_once_it_runs_ahead(*args, **kw):
        if worker.ahead.bubble.seqs:
            raise WorkerLost(0, "injected")
        return real(*args, **kw)

    worker.advance = dies_once_it_runs_ahead
    _, samples = trained_samples(trainer)
    assert [e["worker"] for e in trainer.trace.events if e["kind"] == "engine_lost"] == [0]
    _, base = trained_samples(train(tmp_path, tiny_model_dir, plain, workers=3, **options))
    assert [sorted(step) for step in samples] == [sorted(step) for step in base]
    assert all(len(step) == 6 for step in samples)
    assert not any(sid.startswith(AHEAD) for step in samples for sid, _ in step)
    # the lost engine's share goes to the others, and no live engine's share moves: no run made twice
    runs = [(e["step"], e["id"]) for e in trainer.trace.events if e.get("status") == "lookahead"]
    assert runs and len(runs) == len(set(runs))


def test_an_engine_whose_share_is_empty_now_still_stops_its_runs_for_real_requests(model):
    """EngineFill on one of W engines: its runs' prompt is taken for real and the stream's next prompts are
    other engines' (its share of the plan is empty): the runs stop at once (their tokens are drafts now), so
    the real requests dispatched to it take the slots, rather than wait behind runs that no longer pay."""
    engine = Engine(model, EngineConfig(max_num_seqs=4, max_model_len=96), eos_token_ids=[EOS])
    fill = EngineFill()
    ahead = [(0, Request(PROMPT, p, seq_id=f"p0/{k}")) for k, p in enumerate(sampling(1, 4, max_tokens=40))]
    fill.take(Lookahead(0, 2, ahead), None)
    fill.fill(engine, None)
    engine.step()
    assert len(engine.running) == 4 and all(s.lookahead for s in engine.running)
    real = [engine.add_request(r) for _, r in ahead]  # prompt 0 taken for real, on this engine
    fill.take(Lookahead(1, 2, []), None)  # the next prompts are the other engines'
    fill.fill(engine, None)
    assert not any(s.lookahead for s in engine.running) and len(fill.ended()) == 4
    engine.step()
    assert {s.seq_id for s in engine.running} == {s.seq_id for s in real}


@pytest.mark.multi_engine
@pytest.mark.parametrize("resumed_on", [1, 3])
def test_a_lookahead_run_on_two_engines_resumes_on_any_count_with_the_same_samples(
    tmp_path, tiny_model_dir, resumed_on
):
    """Step 0 on two engines, checkpointed; step 1 resumed on `resumed_on` engines: the samples are the
    uninterrupted run's, token for token (the drafts held between steps are lost, never a sample)."""
    _, whole = trained_samples(train(tmp_path, tiny_model_dir, "lookahead", workers=2))
    train(tmp_path, tiny_model_dir, "lookahead", steps=1, workers=2, run="r").run()
    resumed = train(tmp_path, tiny_model_dir, "lookahead", workers=resumed_on, run="r")
    assert resumed.step == 1
    _, rest = trained_samples(resumed, steps=1)
    assert sorted(rest[0]) == sorted(whole[1]) and len(rest[0]) == 6


@pytest.mark.multi_engine
def test_on_two_engines_each_engine_s_share_of_the_plan_is_sent_once_a_step(tmp_path, tiny_model_dir):
    """The next prompts' requests go to an engine with its first slice of a step that has them, not with
    every slice (on Ray each is pickled): later slices send None, and the engine keeps the share it has."""
    trainer = train(tmp_path, tiny_model_dir, "lookahead", workers=2)
    pool, sent = trainer.engine.pool, []
    advance = pool.advance

    def spy(worker, step, plan=None):
        if plan is not None and plan.first:  # a plan of next prompts (not drafts alone)
            sent.append((step, worker, plan.requests is not None))
        advance(worker, step, plan)

    pool.advance = spy
    rows, _ = trained_samples(trainer)
    shares = [(step, worker) for step, worker, full in sent if full]
    assert len(shares) == len(set(shares)) == 4 and len(sent) > len(shares)  # once per engine and step
    assert rows[0]["lookahead_tokens"] > 0 and rows[1]["accepted_tokens"] > 0


@pytest.mark.multi_engine
def test_on_two_engines_the_drafts_held_between_steps_keep_only_their_tokens(tmp_path, tiny_model_dir):
    """Up to 4,096 drafts wait in the controller for their requests' engines: each keeps its tokens, not its
    run's log-probs and policy versions (recorded with the run, never needed by a drafter)."""
    trainer = train(tmp_path, tiny_model_dir, "lookahead", workers=2)
    assert trainer.train_step()["lookahead_tokens"] > 0
    held = [seq for _, seq in trainer.engine._drafts.values()]
    assert held and all(s.response_ids and not s.logprobs and not s.policy_versions for s in held)
    assert all(s.lookahead and s.params.seed is not None for s in held)
