"""A training run's configuration: one dataclass, checked once, saved with the run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from reference_trainer.train.grpo import GRPOConfig
from rlbench.records import read_json

HELD_OUT_SEED = 999_999  # the held-out set's default problem seed (train/heldout.py)


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
    engine: str = "reference"  # rollout engine: "reference" or "vllm" (engine/factory.py decides)
    prompts_per_step: int = 16  # complete groups per update
    group_size: int = 8
    max_tokens: int | None = None  # None: the task's response budget (tasks: max_response_tokens)
    temperature: float = 1.0
    top_p: float = 1.0
    max_num_seqs: int = 128  # engine slot capacity
    max_model_len: int = 2048  # capped by the model's context
    max_prefill_tokens: int = (
        32768  # engine tokens per batched prefill forward (padded): a step's admissions in one go
    )
    checkpoint_every: int = 5
    # A fixed pool of this many prompts cycled per epoch (None = endless): large enough not to be memorised,
    # small enough that every prompt comes back over a run, as RhymeRL's history needs.
    prompt_pool: int | None = 512
    eval_every: int = 10  # held-out evaluation at step 0 and every this many steps (0: never)
    eval_problems: int = 128  # the held-out set's size
    eval_samples: int = 4  # draws per held-out problem for val/heldout_pass1
    heldout_seed: int = HELD_OUT_SEED  # the held-out set's problem seed; never the training seed
    workers: int = 1  # rollout engine replicas; > 1 runs them as Ray actors (rollout/workers.py)
    worker_backend: str = "ray"  # "ray", or "local": in-process, one after another (tests, debugging)
    ray_address: str | None = None  # an existing Ray cluster; None = start a local one
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(lr=1e-4, micro_batch_size=32))

    @property
    def response_tokens(self) -> int:
        """The response budget: max_tokens, or when unset the task's (tasks: max_response_tokens)."""
        from reference_trainer.tasks import TASKS

        return TASKS[self.task].max_response_tokens if self.max_tokens is None else self.max_tokens

    def check(self) -> None:
        """Refuse settings under which the update would not be the policy gradient of what was sampled."""
        if self.temperature <= 0:
            raise ValueError("training samples at --temperature > 0 (greedy rollouts have no log-probs)")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if self.grpo.temperature is not None and self.grpo.temperature != self.temperature:
            raise ValueError(
                f"grpo.temperature {self.grpo.temperature} differs from the rollout temperature "
                f"{self.temperature}; the update must score tokens under the distribution that sampled them "
                "(leave grpo.temperature unset: it follows the rollout's)"
            )
        if self.eval_every > 0 and self.heldout_seed == self.seed:
            raise ValueError(
                f"heldout_seed {self.heldout_seed} is the training seed: the held-out set would be training "
                "prompts"
            )
        if self.top_p != 1.0:
            # The engine would sample from the top-p truncated distribution while the update's ratios,
            # TIS weights and entropy use the full softmax: behaviour and target log-probs would disagree.
            raise ValueError(
                f"top_p {self.top_p} is not supported for training: the update scores tokens under the "
                "untruncated softmax, so rollouts must sample from it (top_p 1)"
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
    """The config a run in out_dir was started with (what --resume continues)."""
    path = Path(out_dir) / "train_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir} holds no training run (no train_config.json)")
    return TrainConfig.from_json(read_json(path))
