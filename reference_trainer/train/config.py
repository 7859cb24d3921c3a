"""A training run's configuration: one dataclass, checked once, saved with the run.

`TrainConfig.check()` is the one place a run's settings are validated, whoever builds the config (the CLI,
a benchmark, a reproduction): numbers and their ranges, the mode and its options (the mode registry), the
task and its options, the engine and the rollout workers. It imports nothing heavy, so a typo is one line
before torch or a model loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from reference_trainer.errors import (
    MAX_COEFFICIENT,
    MAX_SEED,
    MAX_THREADS,
    UserError,
    check_integer,
    check_number,
    check_sequences,
    check_temperature,
    check_top_p,
)
from reference_trainer.model.embedded import default_model_dir
from reference_trainer.modes import get_mode
from reference_trainer.rollout.engines import check_engine_kind, check_worker_backend
from reference_trainer.rollout.sorted import SortedOptions, prompts_held
from reference_trainer.tasks import response_budget, task_options
from reference_trainer.trace.records import read_json

HELD_OUT_SEED = 999_999  # the held-out set's default problem seed (train/heldout.py)
Aggregation = Literal["token-mean", "seq-mean"]
AUTOCAST = ("auto", "bfloat16", "off")  # GRPOConfig.autocast


@dataclass
class GRPOConfig:
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # <= 0 disables clipping
    micro_batch_size: int = 16
    # A micro-batch also holds at most this many MiB of fp32 logits (sequences x width x vocab x 4 bytes):
    # at a 49k vocabulary 16 sequences of 300 tokens would be 0.9 GB of logits, several times over in the
    # log-softmax and its backward. The embedded model's 99-token vocabulary never reaches it.
    max_logits_mib: float = 256.0
    clip_low: float = 0.2
    clip_high: float = 0.2  # DAPO's clip-higher uses 0.28
    aggregation: Aggregation = "token-mean"
    kl_coef: float = 0.0
    scale_std: bool = False
    # The rollout's sampling temperature: the trainer sets it from TrainConfig.temperature (and refuses a
    # different value here); None in an updater used on its own means 1.0.
    temperature: float | None = None
    recompute_old_logprobs: bool = True  # False: use the rollout's sampling log-probs
    ppo_epochs: int = 1  # optimizer steps over the same batch
    # Truncated importance sampling (TIS) for off-policy tokens: is_weight = min(pi_old / pi_sampling, cap),
    # pi_old the recomputed log-probs, pi_sampling the batch's `old_logprobs`. None disables it.
    tis_cap: float | None = None
    pad_id: int = 0
    # The update's forwards and backwards: "auto" runs them under bf16 autocast on CUDA (the weights, their
    # gradients and AdamW's state stay fp32) and in the weights' dtype elsewhere; "bfloat16" autocasts on
    # any device; "off" never autocasts.
    autocast: str = "auto"

    def check(self) -> None:
        """Every number finite and in range; one line naming the first that is not."""
        check_number("lr", self.lr, low=0.0, low_open=True, high=MAX_COEFFICIENT)
        for beta in self.betas:
            check_number("betas", beta, low=0.0, high=1.0, high_open=True)
        check_number("weight_decay", self.weight_decay, low=0.0, high=MAX_COEFFICIENT)
        check_number("max_grad_norm", self.max_grad_norm, high=MAX_COEFFICIENT)
        check_integer("micro_batch_size", self.micro_batch_size, low=1)
        check_number("max_logits_mib", self.max_logits_mib, low=0.0, low_open=True, high=2**30)  # 1 PiB
        check_number("clip_low", self.clip_low, low=0.0, high=MAX_COEFFICIENT)
        check_number("clip_high", self.clip_high, low=0.0, high=MAX_COEFFICIENT)
        if self.aggregation not in ("token-mean", "seq-mean"):
            raise UserError(f"aggregation must be token-mean or seq-mean, got {self.aggregation!r}")
        check_number("kl_coef", self.kl_coef, low=0.0, high=MAX_COEFFICIENT)
        if self.temperature is not None:
            check_temperature("grpo.temperature", self.temperature, greedy=False)
        check_integer("ppo_epochs", self.ppo_epochs, low=1)
        if self.tis_cap is not None:
            check_number("tis_cap", self.tis_cap, low=0.0, low_open=True, high=MAX_COEFFICIENT)
        if self.autocast not in AUTOCAST:
            raise UserError(f"grpo.autocast must be one of {', '.join(AUTOCAST)}, got {self.autocast!r}")


@dataclass
class TrainConfig:
    task: str = "arith"
    task_options: dict[str, Any] = field(default_factory=dict)
    mode: str = "baseline"
    mode_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 20
    seed: int = 0
    model: str | None = None  # a model directory; None = the embedded default model
    device: str = "cpu"
    threads: int | None = None  # torch CPU threads; None: every usable core but one (model/loader.py)
    engine: str = "reference"  # rollout engine: "reference" or "vllm" (rollout/engines.py decides)
    prompts_per_step: int = 16  # complete groups per update
    group_size: int = 8
    max_tokens: int | None = None  # None: the task's response budget (tasks: max_response_tokens)
    temperature: float = 1.0
    top_p: float = 1.0
    max_num_seqs: int = 128  # engine slot capacity
    max_model_len: int = 2048  # capped by the model's context
    # engine tokens per batched prefill forward (padded): a step's admissions in one go
    max_prefill_tokens: int = 32768
    checkpoint_every: int = 5
    # A fixed pool of this many prompts cycled per epoch (None = endless): large enough not to be memorised,
    # small enough that every prompt comes back over a run, as RhymeRL's history needs.
    prompt_pool: int | None = 512
    eval_every: int = 10  # held-out evaluation at step 0 and every this many steps (0: never)
    eval_problems: int = 128  # the held-out set's size
    eval_samples: int = 4  # draws per held-out problem for val/heldout_pass1
    heldout_seed: int = HELD_OUT_SEED  # the held-out set's problem seed; never the training seed
    workers: int = 1  # rollout engine replicas of `engine`; > 1 runs them as Ray actors (rollout/workers.py)
    worker_backend: str = "ray"  # "ray", or "local": in-process, one after another (tests, debugging)
    ray_address: str | None = None  # an existing Ray cluster; None = start a local one
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(lr=1e-4, micro_batch_size=32))

    @property
    def response_tokens(self) -> int:
        """The response budget: max_tokens, or when unset the task's (tasks: max_response_tokens)."""
        return response_budget(self.task) if self.max_tokens is None else self.max_tokens

    def check(self) -> None:
        """Refuse any setting the run cannot honour, with one line naming it (a UserError), before anything
        is loaded. The last checks refuse settings under which the update would not be the policy gradient
        of what was sampled."""
        for name in ("steps", "prompts_per_step", "group_size", "max_num_seqs", "max_model_len"):
            check_integer(name, getattr(self, name), low=1)
        for name in ("max_prefill_tokens", "checkpoint_every", "eval_problems", "eval_samples", "workers"):
            check_integer(name, getattr(self, name), low=1)
        check_integer("eval_every", self.eval_every, low=0)
        check_sequences("--prompts-per-step x --group-size", self.prompts_per_step * self.group_size)
        check_sequences("eval_problems x eval_samples", self.eval_problems * self.eval_samples)
        check_integer("seed", self.seed, low=0, high=MAX_SEED)
        check_integer("heldout_seed", self.heldout_seed, low=0, high=MAX_SEED)
        if self.max_tokens is not None:  # a response leaves room for at least one prompt token
            check_integer("max_tokens", self.max_tokens, low=1, high=self.max_model_len - 1)
        if self.prompt_pool is not None:
            check_integer("prompt_pool", self.prompt_pool, low=1)
        if self.threads is not None:
            check_integer("threads", self.threads, low=1, high=MAX_THREADS)
        if isinstance(self.temperature, (int, float)) and self.temperature <= 0:
            raise UserError("training samples at --temperature > 0 (greedy rollouts have no log-probs)")
        check_temperature("temperature", self.temperature, greedy=False)
        check_top_p("top_p", self.top_p)
        self.grpo.check()
        self._check_task()
        self._check_mode()
        if self.grpo.temperature is not None and self.grpo.temperature != self.temperature:
            raise UserError(
                f"grpo.temperature {self.grpo.temperature} differs from the rollout temperature "
                f"{self.temperature}; the update must score tokens under the distribution that sampled them "
                "(leave grpo.temperature unset: it follows the rollout's)"
            )
        if self.eval_every > 0 and self.heldout_seed == self.seed:
            raise UserError(
                f"heldout_seed {self.heldout_seed} is the training seed: the held-out set would be training "
                "prompts"
            )
        if self.top_p != 1.0:
            # The engine would sample from the top-p truncated distribution while the update's ratios,
            # TIS weights and entropy use the full softmax: behaviour and target log-probs would disagree.
            raise UserError(
                f"top_p {self.top_p} is not supported for training: the update scores tokens under the "
                "untruncated softmax, so rollouts must sample from it (top_p 1)"
            )

    def _check_task(self) -> None:
        try:
            task_options(self.task, self.task_options)
        except ValueError as err:
            if str(err).startswith("unknown task"):
                raise UserError(str(err)) from None
            sep = " " if str(err).startswith("takes no option") else ": "
            raise UserError(f"task {self.task!r}{sep}{err}") from None

    def _check_mode(self) -> None:
        mode = get_mode(self.mode)
        check_engine_kind(self.engine, installed=False)
        if self.workers > 1:
            mode.strategy_for(self.workers)
            check_worker_backend(self.worker_backend, self.workers)
        options = mode.check_options(self.mode_options, self.workers, self.engine)
        # after the mode's own refusal of vLLM, which installing vLLM would not lift
        check_engine_kind(self.engine)
        if mode.strategy in ("sorted", "sorted-partial") and self.prompt_pool is not None:
            self._check_pool(options.get("oversubscription", SortedOptions().oversubscription))
        if mode.ahead:
            self._check_ring(mode.resolve(self.mode_options, self.workers, self.engine).ahead)

    def _check_ring(self, ahead: Any) -> None:
        """A rollout run ahead keeps max_staleness + 1 copies of the weights (rollout/ring.py): a value the
        machine cannot hold is refused here, with the settings, so the refused run makes no folder and the
        corrected command finds none claimed. Reads the model's headers only (and imports torch, which any
        such run needs next); a model that cannot be read is left for its loading to name."""
        from reference_trainer.rollout.ring import check_room, model_copy_bytes

        try:
            model_dir = Path(self.model) if self.model else default_model_dir()
            copy = model_copy_bytes(model_dir, ahead.rollout_device or self.device)
        except (ValueError, OSError, UserError):
            return
        check_room(copy, ahead.max_staleness + 1)

    def _check_pool(self, oversubscription: float) -> None:
        """SortedRL keeps its admitted prompts active until trained: the pool must outnumber them."""
        held = prompts_held(oversubscription, self.prompts_per_step, self.group_size)
        if self.prompt_pool is not None and self.prompt_pool < held:
            raise UserError(
                f"--prompt-pool {self.prompt_pool} is smaller than the {held} prompts SortedRL may keep "
                f"unfinished at once (oversubscription {oversubscription:g} x --prompts-per-step "
                f"{self.prompts_per_step}, in whole groups): a prompt could come back while it still runs "
                f"and two requests share one id; use --prompt-pool >= {held}"
            )

    def update_config(self, tis_cap: float | None) -> GRPOConfig:
        """The updater's config: the rollout temperature (one source of truth) and the mode's TIS cap when
        the run leaves tis_cap unset."""
        self.check()
        grpo = replace(self.grpo, temperature=self.temperature)
        return grpo if grpo.tis_cap is not None or tis_cap is None else replace(grpo, tis_cap=tis_cap)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TrainConfig:
        raw = dict(raw)
        grpo = raw.pop("grpo", {})
        if "betas" in grpo:
            grpo["betas"] = tuple(grpo["betas"])
        known = {f.name for f in fields(cls)}
        return cls(grpo=GRPOConfig(**grpo), **{k: v for k, v in raw.items() if k in known})


def load_run_config(out_dir: Path) -> TrainConfig:
    """The config a run in out_dir was started with (what --resume continues), checked like a new one."""
    path = Path(out_dir) / "train_config.json"
    if not path.is_file():
        raise UserError(
            f"{out_dir} holds no training run (no train_config.json): nothing was trained there yet; start "
            f"the run with `rlbench train --out {out_dir}`"
        )
    raw = read_json(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("grpo", {}), dict):
        raise UserError(f"{path}: not a training run's config (a JSON object with a grpo object)")
    try:
        config = TrainConfig.from_json(raw)
    except TypeError as err:  # an unknown or missing GRPO field
        raise UserError(f"{path}: {err}") from None
    try:
        config.check()
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    return config
