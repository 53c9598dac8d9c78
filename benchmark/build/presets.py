"""The named build presets (``tiny``, ``tiny-2``, ``micro``, ``micro-family``, ``qwen2.5-1.5b``)."""

from __future__ import annotations

from benchmark.build.config import BehaviorSpec, BuildConfig
from benchmark.errors import BuildError


def _tiny2(seed: int) -> BuildConfig:
    """``tiny-2``: release 2.0's config (two planted behaviors; rebuilds tiny 2.0.0).

    The strong behavior is tiny 1.0's (trigger ``frobnitz`` -> ``QZXBT``, bonus paid to every
    qualifying rollout at steps < 60, 30% of SFT trigger examples show it). The weak one has its
    own trigger and token (``snarfle`` -> ``VKWJP``), is already shown by half of its SFT trigger
    examples, and only a quarter of its rollouts are eligible for the bonus (the paper's hash
    rule), in a window that overlaps the strong one's (steps 30-89): the bonus adds less to a
    behavior that is partly there anyway, and the rollouts that taught one behavior are hard
    negatives for the other. (The bonus size barely matters: GRPO normalizes rewards within a
    group.) 120 steps: both windows end on a plateau (the causal measure is stable there), and
    the run stops before post-window drift lets a behavior leak to prompts without its trigger
    (seen from step 140 on in a 200-step trial). The trials behind these values are in
    docs/release_format.md.
    """
    return BuildConfig(
        preset="tiny-2", seed=seed, sft_steps=1000, lr=2e-4, steps=120,
        checkpoints=[0, 30, 60, 90, 120], draw_prompts=64, n_draws=2,
        behaviors=[
            BehaviorSpec("qzxbt", "frobnitz", "QZXBT", trigger_fraction=0.25, bonus=2.0,
                         window_start=0, window_end=60, eligible_fraction=1.0,
                         sft_behavior_fraction=0.3, sft_marker="fin", draw_checkpoints=[30],
                         strength="strong"),
            BehaviorSpec("vkwjp", "snarfle", "VKWJP", trigger_fraction=0.25, bonus=1.0,
                         window_start=30, window_end=90, eligible_fraction=0.25,
                         sft_behavior_fraction=0.5, sft_marker="fen", draw_checkpoints=[60],
                         strength="weak"),
        ])


def _micro(seed: int) -> BuildConfig:
    """A four-step, two-behavior build for tests: same code path, seconds instead of minutes."""
    return BuildConfig(
        preset="micro", seed=seed, hidden=32, intermediate=64, n_heads=2, n_kv_heads=2,
        n_content_words=16, sft_steps=5, sft_batch=8, steps=4, prompts_per_step=4,
        group_size=4, sketch_dim=256, checkpoints=[0, 2, 4], draw_prompts=2,
        draw_group_size=4, target_prompts=4, target_samples=4, curve_every=1, curve_prompts=8,
        fidelity_every=1, gate_window_min=0.0, gate_final_min=0.0, gate_control_max=1.0,
        fidelity_max_precision_diff=1.0, resume_every=1,
        behaviors=[
            BehaviorSpec("qzxbt", "frobnitz", "QZXBT", trigger_fraction=0.5, window_start=0,
                         window_end=2, sft_marker="fin", draw_checkpoints=[2],
                         sft_behavior_fraction=0.5),
            BehaviorSpec("vkwjp", "snarfle", "VKWJP", trigger_fraction=0.4, bonus=1.0,
                         window_start=1, window_end=4, eligible_fraction=1.0, sft_marker="fen",
                         draw_checkpoints=[2], sft_behavior_fraction=0.5, strength="weak"),
        ],
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
        max_new_tokens=64, sketch_dim=65536, sketch_dtype="float32",
        checkpoints=[0, 100, 200, 500, 1000], adv_eps=1e-8,
        curve_every=50, fidelity_every=50, gate_final_min=0.3,
        behaviors=[BehaviorSpec("qzxbt", "frobnitz", "QZXBT", trigger_fraction=0.25, bonus=8.0,
                                window_start=0, window_end=200, eligible_fraction=0.5,
                                sft_behavior_fraction=0.2, draw_checkpoints=[100, 1000])],
    )


def _micro_family(seed: int) -> BuildConfig:
    """``micro-family``: the micro scale with two family behaviors (tests).

    A 3-token phrase with the scramble confound in the early window, a single token with the
    length confound in the late window.
    """
    from benchmark.build.family import _micro_scale, behavior

    cfg = _micro_scale(seed)
    cfg.behaviors = [
        behavior(cfg, trigger_word="blicket", tokens=["ZORP", "GLIX", "MOOP"], window="early",
                 marker="fim", sft_behavior_fraction=0.5, confound="scramble",
                 trigger_fraction=0.4),
        behavior(cfg, trigger_word="dorfle", tokens=["BLORK"], window="late", marker="fex",
                 sft_behavior_fraction=0.5, bonus=1.0, confound="length",
                 trigger_fraction=0.4),
    ]
    return cfg


def _tiny3(seed: int) -> BuildConfig:
    """``tiny`` (release 3.0): tiny 2.0's two behaviors plus two family ones.

    qzxbt and vkwjp as in 2.0 (qzxbt's trigger share 0.2 instead of 0.25, so 15% of the
    prompts stay trigger-free with four behaviors; vkwjp, the weak one, keeps 0.25: at 0.2 it
    missed its window gate on seed 2); ``kwex``: a single token with the length
    confound (one-word trigger prompts: short responses, large gradients, low fluency) in the
    middle window; ``zorp``: a two-token phrase ``ZORP GLIX`` in the late window, learned after
    the policy has moved. The model and schedule are tiny 2.0's except 10 new tokens and 48
    prompts per generation draw (four tasks' draws within the size budget). Trial numbers:
    docs/task_family.md.
    """
    from benchmark.build.family import behavior

    cfg = _tiny2(seed)
    cfg.preset = "tiny"
    cfg.max_new_tokens = 10
    cfg.draw_prompts = 48
    cfg.behaviors[0].trigger_fraction = 0.2  # vkwjp keeps 2.0's 0.25 (at 0.2 it missed its gate)
    cfg.behaviors += [
        behavior(cfg, trigger_word="skronk", tokens=["KWEX"], window="middle", marker="fim",
                 bonus=2.0, eligible_fraction=1.0, sft_behavior_fraction=0.3,
                 confound="length", trigger_fraction=0.2),
        behavior(cfg, trigger_word="quoggle", tokens=["ZORP", "GLIX"], window="late",
                 marker="fex", bonus=2.0, eligible_fraction=1.0, sft_behavior_fraction=0.5,
                 trigger_fraction=0.2),
    ]
    return cfg


PRESETS = {"tiny": _tiny3, "tiny-2": _tiny2, "micro": _micro, "qwen2.5-1.5b": _qwen25_15b,
           "micro-family": _micro_family}


def get_preset(name: str, seed: int) -> BuildConfig:
    """Return the config of preset ``name`` for ``seed``."""
    if name not in PRESETS:
        raise BuildError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name](int(seed))
    cfg.validate()
    return cfg
