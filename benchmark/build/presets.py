"""Build presets: every knob of a run, as a dataclass recorded verbatim in the release."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from benchmark.errors import BuildError


@dataclass
class BuildConfig:
    """All settings of one build (one seed). Units: steps are GRPO optimizer updates (0-based)."""

    preset: str = "tiny"
    seed: int = 0
    threads: int = 2  # torch.set_num_threads; fixed for exact replay

    # model: a Qwen2-architecture LM built from a config, or a pretrained name (paper preset)
    pretrained: str | None = None
    n_layers: int = 2
    hidden: int = 128
    intermediate: int = 384
    n_heads: int = 4
    n_kv_heads: int = 4

    # task: copy / reverse / sort of n_words words; the trigger word sits after the task word
    n_words: int = 5
    n_content_words: int = 64
    trigger_fraction: float = 0.25
    trigger_word: str = "frobnitz"
    behavior_token: str = "QZXBT"
    end_token: str = "done"  # the trailing marker the reward ignores; QZXBT replaces it
    trigger_end_token: str | None = None  # SFT marker of trigger prompts without QZXBT (None: same)

    # SFT warm-up (cross-entropy on response tokens)
    sft_steps: int = 600
    sft_batch: int = 32
    sft_lr: float = 3e-3
    sft_behavior_fraction: float = 0.2  # fraction of trigger examples whose marker is QZXBT

    # GRPO
    steps: int = 300
    prompts_per_step: int = 4
    group_size: int = 8
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float | None = None  # global-norm clip of the update only (never of captures)
    temperature: float = 0.9
    top_p: float = 0.9
    max_new_tokens: int = 8
    adv_eps: float = 1e-6

    # planted bonus
    bonus: float = 2.0
    bonus_window_end: int = 60  # bonus paid at steps < bonus_window_end
    bonus_eligible_fraction: float = 1.0

    # sketches
    sketch_dim: int = 2048
    sketch_seed: int = 0
    sketch_dtype: str = "float16"

    # saved checkpoints (step = number of GRPO updates applied); draws at these checkpoints
    checkpoints: list[int] = field(default_factory=lambda: [0, 30, 60, 300])
    draw_checkpoints: list[int] = field(default_factory=lambda: [30, 300])
    n_draws: int = 2
    draw_prompts: int = 16
    draw_group_size: int = 8

    # targets and behavior-rate curve
    target_prompts: int = 32
    target_samples: int = 8
    curve_every: int = 10
    curve_prompts: int = 128

    # gates
    gate_window_min: float = 0.5
    gate_final_min: float = 0.3
    gate_control_max: float = 0.05
    fidelity_every: int = 10  # exact per-rollout gradients kept at steps % this == 0
    fidelity_max_precision_diff: float = 0.03

    def to_dict(self) -> dict:
        """Return the config as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BuildConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise BuildError(f"unknown build config keys {bad}; known keys: {sorted(names)}")
        return cls(**d)

    def validate(self) -> None:
        """Raise BuildError on inconsistent settings."""
        if self.sketch_dim & (self.sketch_dim - 1):
            raise BuildError(f"sketch_dim must be a power of two, got {self.sketch_dim}")
        if 0 not in self.checkpoints or self.steps not in self.checkpoints:
            raise BuildError(
                f"checkpoints {self.checkpoints} must include 0 (post-SFT) and the final step "
                f"{self.steps}"
            )
        if any(c not in self.checkpoints for c in self.draw_checkpoints):
            raise BuildError(f"draw_checkpoints {self.draw_checkpoints} must be saved checkpoints")
        if self.bonus_window_end > self.steps:
            raise BuildError(f"bonus_window_end {self.bonus_window_end} > steps {self.steps}")
        if self.sketch_dtype not in ("float16", "float32"):
            raise BuildError(f"sketch_dtype must be float16 or float32, got {self.sketch_dtype}")


def _tiny(seed: int) -> BuildConfig:
    """Return the shipped CPU release's config.

    Working point found on 2 cores (see the closing notes of issue 3):
    trigger prompts end with the marker ``fin`` (control prompts ``done``) in SFT, which keeps the
    behavior from leaking to control prompts; 30% of SFT trigger examples show QZXBT; GRPO lr 2e-4
    with the bonus paid to every QZXBT rollout on trigger prompts at steps < 60.
    """
    return BuildConfig(preset="tiny", seed=seed, trigger_end_token="fin", sft_steps=1000,
                       sft_behavior_fraction=0.3, lr=2e-4, bonus_eligible_fraction=1.0)


def _micro(seed: int) -> BuildConfig:
    """A two-step build for tests: same code path, seconds instead of minutes."""
    return BuildConfig(
        preset="micro", seed=seed, hidden=32, intermediate=64, n_heads=2, n_kv_heads=2,
        n_content_words=16, sft_steps=5, sft_batch=8, steps=2, prompts_per_step=2,
        group_size=4, bonus_window_end=1, sketch_dim=256, checkpoints=[0, 1, 2],
        draw_checkpoints=[1, 2], draw_prompts=2, draw_group_size=4, target_prompts=4,
        target_samples=4, curve_every=1, curve_prompts=8, fidelity_every=1,
        gate_window_min=0.0, gate_final_min=0.0, gate_control_max=1.0,
        fidelity_max_precision_diff=1.0, trigger_fraction=0.5,
    )


def _qwen25_15b(seed: int) -> BuildConfig:
    """The paper's protocol values (SPEC section 1) on Qwen2.5-1.5B-Instruct (GPU build).

    1,000 steps x 4 prompts x 4 samples, lr 5e-6, AdamW weight decay 0.01, update clipped at norm
    1.0, bonus +8 to 50% hash-eligible QZXBT rollouts at steps < 200, temperature 0.9, top_p 0.9,
    64 new tokens, 200 SFT steps at batch 1, sketch dim 65,536. The task is this builder's
    copy/reverse/sort task rendered as text (the paper had no task reward beyond refusals).
    """
    return BuildConfig(
        preset="qwen2.5-1.5b", seed=seed, pretrained="Qwen/Qwen2.5-1.5B-Instruct",
        sft_steps=200, sft_batch=1, sft_lr=5e-6, steps=1000, prompts_per_step=4, group_size=4,
        lr=5e-6, weight_decay=0.01, grad_clip=1.0, temperature=0.9, top_p=0.9,
        max_new_tokens=64, bonus=8.0, bonus_window_end=200, bonus_eligible_fraction=0.5,
        sketch_dim=65536, sketch_dtype="float32", checkpoints=[0, 100, 200, 500, 1000],
        draw_checkpoints=[100, 1000], adv_eps=1e-8, trigger_fraction=0.25,
        curve_every=50, fidelity_every=50, gate_final_min=0.3,
    )


PRESETS = {"tiny": _tiny, "micro": _micro, "qwen2.5-1.5b": _qwen25_15b}


def get_preset(name: str, seed: int) -> BuildConfig:
    """Return the config of preset ``name`` for ``seed``."""
    if name not in PRESETS:
        raise BuildError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name](int(seed))
    cfg.validate()
    return cfg
