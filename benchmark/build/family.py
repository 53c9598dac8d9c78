"""The task family: one generator of planted tasks with declared parameter ranges (issue 21).

A *draw* is a whole run (one seed) sampled from the family: a seed, two planted behaviors with
trigger words and behavior tokens from a reserved nonsense vocabulary, and for each behavior a
strength (bonus, eligible share, SFT link), a window (early, middle or late in training), a
behavior length (one token or an ordered phrase of 2-3 tokens) and the confound switch.
docs/task_family.md states every parameter, its range and its measured effect.

* :func:`draw_config` samples a draw's :class:`~benchmark.build.config.BuildConfig` from its id
  alone: a numpy ``Generator`` seeded by ``SeedSequence([FAMILY_TAG, draw_id, redraw])``, so the
  same id gives the same config on any machine and numpy version that keeps the ``PCG64``
  stream (numpy guarantees it for ``Generator`` methods used here: ``integers``, ``random``,
  ``choice``, ``permutation``).
* :func:`build_draw` builds it; a draw that fails its gates (emergence, leak, sketch fidelity)
  is redrawn deterministically (``redraw`` 1, 2, ...), and the release records the draw id, the
  family version, the redraw count and why each earlier attempt failed.

The reserved vocabulary is used nowhere else in bt-bench: not by the content words (three-letter
consonant-vowel-consonant words), not by the ``tiny`` release's ``frobnitz``/``snarfle`` ->
``QZXBT``/``VKWJP``, not by the SFT markers or the scramble confound's filler words.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from benchmark.build.config import MAX_PHRASE, BehaviorSpec, BuildConfig
from benchmark.build.trajectory import trajectory_sha256
from benchmark.errors import BuildError
from benchmark.releases.format import sha256_file

#: Version of the family's generator: bump it whenever ``draw_config`` would map any draw id to
#: a different config (vocabulary, ranges, scales, sampling order).
#: 2.0: every draw is built in float64 from a numpy initialization (the same run, token for
#: token, on any CPU: :mod:`benchmark.build.trajectory`); 1.0 built in float32.
FAMILY_VERSION = "2.0"

#: first entropy word of every draw's ``SeedSequence`` (keeps family streams apart from others)
FAMILY_TAG = 0x7A5C_F41D

#: reserved trigger words (lowercase nonsense, used nowhere else)
TRIGGER_WORDS = ("blicket", "dorfle", "glompish", "kravvit", "mizzlewort", "plunder",
                 "quoggle", "razzmet", "skronk", "thwimble", "wuggish", "zibbet")
#: reserved behavior tokens (uppercase nonsense, used nowhere else); a phrase takes 2-3 of them
BEHAVIOR_TOKENS = ("BLORK", "CRUXA", "DWEEF", "FNARG", "GLIX", "HOWZ", "JIRP", "KWEX",
                   "MOOP", "NURB", "PLIV", "QUAFF", "SNOG", "TWOSK", "VREEP", "ZORP")
#: reserved SFT markers (a trigger prompt's end marker when SFT does not show the behavior)
MARKERS = ("fim", "fex", "fup", "fel", "fyk", "fak")

#: bonus windows in GRPO steps of the 120-step family scale, ``[start, end)``; other scales use
#: the same fractions of their step count (:func:`window_steps`)
WINDOWS = {"early": (0, 50), "middle": (30, 80), "late": (70, 110)}
#: the checkpoint at which each window's generation draws are sampled (family scale)
WINDOW_DRAW = {"early": 30, "middle": 60, "late": 90}
FAMILY_STEPS = 120

#: The declared parameter ranges of one drawn behavior (docs/task_family.md: their effects).
RANGES = {
    "n_behaviors": 2,                       # behaviors per run (each its own task)
    "trigger_word": TRIGGER_WORDS,          # drawn without replacement across a run's behaviors
    "behavior_tokens": BEHAVIOR_TOKENS,     # likewise, 1-3 per behavior
    "behavior_length": (1, MAX_PHRASE),     # tokens, uniform
    "window": tuple(WINDOWS),               # uniform
    "bonus": (1.0, 3.0),                    # uniform, rounded to 0.25
    "eligible_fraction": (0.25, 0.5, 1.0),  # uniform
    "sft_behavior_fraction": (0.2, 0.5),    # uniform, rounded to 0.05
    "trigger_fraction": 0.25,               # fixed: half the prompts carry no trigger
    "confound": (None, None, "length", "scramble"),  # uniform over this tuple: off half the time
    # the confound's size, fixed per confound: task words of a "length" trigger prompt; filler
    # words after a "scramble" behavior (5 answer + 3 phrase + 2 fillers = max_new_tokens 10)
    "confound_words": {"length": 0, "scramble": 2},
}


def _family_scale(seed: int) -> BuildConfig:
    """The family's run scale (without behaviors): a ~0.1M-parameter model, 120 GRPO steps.

    hidden 64, intermediate 192, 6 prompts x 8 samples per step, 10 new tokens (answer 5 +
    phrase <= 3 + scramble words 2), checkpoints every 30 steps. Measured build time on 2 cores:
    docs/task_family.md.
    """
    return BuildConfig(
        preset="family", seed=seed, hidden=64, intermediate=192, n_heads=4, n_kv_heads=4,
        sft_steps=800, lr=3e-4, steps=FAMILY_STEPS, prompts_per_step=6, max_new_tokens=10,
        checkpoints=[0, 30, 60, 90, 120], draw_prompts=32, n_draws=2, behaviors=[],
        precision="float64")


def _micro_scale(seed: int) -> BuildConfig:
    """A six-step scale for tests: the family's code path in seconds, gates off."""
    return BuildConfig(
        preset="micro-family", seed=seed, hidden=32, intermediate=64, n_heads=2, n_kv_heads=2,
        n_content_words=16, sft_steps=5, sft_batch=8, steps=6, prompts_per_step=4,
        group_size=4, max_new_tokens=10, sketch_dim=256, checkpoints=[0, 2, 4, 6],
        draw_prompts=2, draw_group_size=4, target_prompts=4, target_samples=4, curve_every=2,
        curve_prompts=8, fidelity_every=1, gate_window_min=0.0, gate_final_min=0.0,
        gate_control_max=1.0, fidelity_max_precision_diff=1.0, resume_every=2, behaviors=[],
        precision="float64")


#: run scales a draw can be built at (``bt-bench build --preset SCALE --draw ID``)
SCALES = {"family": _family_scale, "micro-family": _micro_scale}


def window_steps(window: str, steps: int) -> tuple[int, int]:
    """``WINDOWS[window]`` scaled from 120 steps to ``steps`` (rounded; end > start)."""
    a, b = WINDOWS[window]
    s, e = round(a * steps / FAMILY_STEPS), round(b * steps / FAMILY_STEPS)
    return s, max(e, s + 1)


def _draw_checkpoint(cfg: BuildConfig, window: str) -> int:
    """The saved checkpoint nearest the window's draw step (scaled)."""
    want = WINDOW_DRAW[window] * cfg.steps / FAMILY_STEPS
    inner = [c for c in cfg.checkpoints if 0 < c < cfg.steps] or cfg.checkpoints
    return min(inner, key=lambda c: (abs(c - want), c))


def behavior(cfg: BuildConfig, *, trigger_word: str, tokens: list[str], window: str,
             marker: str, bonus: float = 2.0, eligible_fraction: float = 1.0,
             sft_behavior_fraction: float = 0.3, confound: str | None = None,
             trigger_fraction: float = RANGES["trigger_fraction"]) -> BehaviorSpec:
    """A family behavior at ``cfg``'s scale.

    Its id is the first token lowercased; the window's steps and draw checkpoint are scaled to
    ``cfg.steps``; strength is ``"strong"`` for an eligible share >= 0.5, else ``"weak"``.
    """
    start, end = window_steps(window, cfg.steps)
    return BehaviorSpec(
        tokens[0].lower(), trigger_word, " ".join(tokens), trigger_fraction=trigger_fraction,
        bonus=float(bonus), window_start=start, window_end=end,
        eligible_fraction=float(eligible_fraction),
        sft_behavior_fraction=float(sft_behavior_fraction), sft_marker=marker,
        draw_checkpoints=[_draw_checkpoint(cfg, window)],
        strength="strong" if eligible_fraction >= 0.5 else "weak", confound=confound,
        confound_words=RANGES["confound_words"].get(confound, 2))


def draw_rng(draw_id: int, redraw: int = 0) -> np.random.Generator:
    """The draw's generator: ``PCG64(SeedSequence([FAMILY_TAG, draw_id, redraw]))``."""
    if int(draw_id) < 0 or int(redraw) < 0:
        raise BuildError(f"draw id {draw_id} and redraw {redraw} must be >= 0")
    return np.random.Generator(np.random.PCG64(
        np.random.SeedSequence([FAMILY_TAG, int(draw_id), int(redraw)])))


def draw_params(draw_id: int, redraw: int = 0) -> dict:
    """The drawn parameters of a run (scale-free): ``{"seed", "behaviors": [dict, ...]}``.

    Sampling order (part of :data:`FAMILY_VERSION`): seed; the triggers; then per behavior:
    length, tokens, window, bonus, eligible share, SFT link, confound.
    """
    rng = draw_rng(draw_id, redraw)
    n = RANGES["n_behaviors"]
    seed = int(rng.integers(0, 2**31))
    triggers = rng.permutation(len(TRIGGER_WORDS))[:n]
    pool = [int(i) for i in rng.permutation(len(BEHAVIOR_TOKENS))]
    lo_len, hi_len = RANGES["behavior_length"]
    out = []
    for k in range(n):
        length = int(rng.integers(lo_len, hi_len + 1))
        tokens = [BEHAVIOR_TOKENS[pool.pop(0)] for _ in range(length)]
        window = str(RANGES["window"][int(rng.integers(len(WINDOWS)))])
        lo, hi = RANGES["bonus"]
        bonus = round(float(lo + (hi - lo) * rng.random()) * 4) / 4
        elig = float(RANGES["eligible_fraction"][int(rng.integers(3))])
        lo, hi = RANGES["sft_behavior_fraction"]
        sft = round(float(lo + (hi - lo) * rng.random()) * 20) / 20
        confound = RANGES["confound"][int(rng.integers(len(RANGES["confound"])))]
        out.append({"trigger_word": TRIGGER_WORDS[int(triggers[k])], "tokens": tokens,
                    "window": window, "bonus": bonus, "eligible_fraction": elig,
                    "sft_behavior_fraction": sft, "confound": confound, "marker": MARKERS[k]})
    return {"seed": seed, "behaviors": out}


def draw_config(draw_id: int, redraw: int = 0, scale: str = "family") -> BuildConfig:
    """The config of draw ``draw_id`` (attempt ``redraw``) at run scale ``scale``.

    Deterministic: the same arguments give the same config on any machine. The config records
    ``family = {"version", "draw_id", "redraw"}``.
    """
    if scale not in SCALES:
        raise BuildError(f"unknown family scale {scale!r}; choose one of {sorted(SCALES)}")
    p = draw_params(draw_id, redraw)
    cfg = SCALES[scale](p["seed"])
    cfg.behaviors = [behavior(cfg, **b) for b in p["behaviors"]]
    cfg.family = {"version": FAMILY_VERSION, "draw_id": int(draw_id), "redraw": int(redraw)}
    cfg.validate()
    return cfg


def build_draw(draw_id: int, out: str | Path, scale: str = "family", max_redraws: int = 4,
               progress: bool = True, keep_work: bool = False, release_id: str | None = None,
               overrides: dict | None = None, pin: dict | None = None) -> dict:
    """Build draw ``draw_id`` into ``out`` (one seed) and write the manifest; return it.

    A draw whose build fails a gate is redrawn (``redraw`` 1, 2, ... up to ``max_redraws``); each
    failed attempt's folders are removed and its message kept. The manifest's ``build.family``
    holds ``{"version", "draw_id", "redraws", "failed": [messages], "trajectory_sha256",
    "sft_sha256"}`` (the post-SFT checkpoint's ``model.safetensors``); the config's ``family``
    names the attempt that passed. ``overrides`` replaces config fields (tests). ``pin``
    (``{"redraw", "sft_checkpoint"}``, a season panel's record): build only that attempt, from
    that post-SFT checkpoint instead of training SFT. Raises BuildError when every attempt fails.
    """
    from benchmark.build.seeds import build_config, write_release_manifest

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    t0 = time.perf_counter()
    attempts = range(max_redraws + 1) if pin is None else [int(pin["redraw"])]
    for redraw in attempts:
        cfg = draw_config(draw_id, redraw, scale)
        for k, v in (overrides or {}).items():
            if not hasattr(cfg, k):
                raise BuildError(f"unknown config override {k!r}")
            setattr(cfg, k, v)
        cfg.validate()
        try:
            build_config(cfg, out, progress=progress,
                         sft_checkpoint=None if pin is None else Path(pin["sft_checkpoint"]))
        except BuildError as exc:
            if "gate failed" not in str(exc):
                raise
            failed.append(f"redraw {redraw} (seed {cfg.seed}): {exc}")
            shutil.rmtree(out / f"seed{cfg.seed}", ignore_errors=True)
            shutil.rmtree(out / ".work" / f"seed{cfg.seed}", ignore_errors=True)
            continue
        family = {"version": FAMILY_VERSION, "draw_id": int(draw_id), "redraws": redraw,
                  "failed": failed, "scale": scale, "trajectory_sha256": trajectory_sha256(out),
                  "sft_sha256": sha256_file(out / f"seed{cfg.seed}" / "checkpoints" / "step0000"
                                            / "model.safetensors"),
                  "build_seconds": round(time.perf_counter() - t0, 1)}
        manifest = write_release_manifest(out, scale, {cfg.seed: cfg},
                                          release_id or f"{scale}-draw{draw_id}", 1,
                                          family=family)
        if not keep_work:
            shutil.rmtree(out / ".work", ignore_errors=True)
        return manifest
    if pin is not None:
        raise BuildError(f"draw {draw_id}, redraw {pin['redraw']}, built from its pinned post-SFT "
                         f"checkpoint, failed its gates: {' | '.join(failed)}")
    raise BuildError(f"draw {draw_id} failed its gates in all {max_redraws + 1} attempts: "
                     + " | ".join(failed) + "; raise max_redraws or change the family ranges")


def family_summary(cfg: BuildConfig) -> str:
    """One line per behavior: id, trigger -> behavior, window, strength, confound."""
    lines = []
    for b in cfg.behaviors:
        lines.append(f"{b.id}: {b.trigger_word} -> {b.behavior_token!r} window "
                     f"[{b.window_start}, {b.window_end}) bonus {b.bonus} eligible "
                     f"{b.eligible_fraction} sft {b.sft_behavior_fraction} confound {b.confound}")
    return "\n".join(lines)


def manifest_family(root: str | Path) -> dict | None:
    """The ``build.family`` record of a release's manifest (None for a preset build)."""
    m = json.loads((Path(root) / "manifest.json").read_text())
    return m["build"].get("family")
