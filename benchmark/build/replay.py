"""Exact replay of a seed's GRPO run with a set of rollouts removed (DESIGN 4a).

``replay(seed_dir, remove=..., stop_at=...)`` restarts GRPO from the shipped post-SFT checkpoint
``checkpoints/step0000`` with a fresh AdamW (as in the build), the same generators (the step's
prompt stream and one sampling stream per group) and a fixed thread count. Removing the rollout
at position ``(step, index)`` sets its advantage to 0 after the group statistics are computed
(its reward still counts in its group's mean and std), so it contributes zero loss. Training is
on-policy: after the first removal, later rollouts differ from the recorded run; positions stay
positions.

Two update paths:

* ``"exact"``: the build's own path (per-rollout gradients via ``vmap(grad)``, summed in the
  build's order, including the rank order of a distributed build). With an empty removal set it
  reproduces the recorded parameters bit for bit on a machine whose kernels match the build
  machine's (``benchmark.machine.kernel_match``); elsewhere it stays within a small, measured
  distance of them (docs/causal.md).
* ``"batched"``: one batched backward of the step loss. Mathematically the same update, other
  float rounding. Deterministic on one machine at one thread count, which is all the causal
  scores need: they are differences against an empty-removal replay made the same way on the same
  machine. The cheaper path.

Sampling uses :func:`benchmark.build.decode.make_decoder`: the lean decoder where it is
bit-identical to the model's own incremental forward on this machine, the model's forward
otherwise. The
behavior measure (:class:`benchmark.build.measure.Measure`) is the one of the build's curve.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmark.build.config import BuildConfig
from benchmark.build.decode import make_decoder
from benchmark.build.grpo import PerRolloutGrad, batched_update, grpo_rollouts, grpo_step
from benchmark.build.measure import Measure
from benchmark.errors import BuildError

MODES = ("exact", "batched")


@dataclass
class ReplayResult:
    """What a replay produced.

    Attributes:
        stop_at: number of GRPO updates applied.
        measures: step -> ``{"behavior_prob": {behavior: mean}, "prompt_probs": {behavior:
            (P,) float64}, "trigger_rate": {behavior: rate}}`` (rates only when sampled),
            measured on the parameters after ``step`` updates.
        snapshots: step -> ``{name: tensor}`` parameter copies (requested steps only).
        responses: step -> list of response ids (only with ``keep_responses``).
        first_divergent_step: first step whose sampled responses differ from ``reference``
            responses (None: none differ, or no reference given).
        seconds: wall time of the training loop (model loading excluded).
        threads: torch thread count used.
        mode: update path.
        decoder: ``"lean"`` or ``"hf"`` (which forward sampled; the logits are the same).
        states: step -> resumable state (parameters and optimizer state before that step's
            update), only with ``save_states``; pass one back as ``start_state``.
    """

    stop_at: int
    measures: dict = field(default_factory=dict)
    snapshots: dict = field(default_factory=dict)
    responses: dict = field(default_factory=dict)
    first_divergent_step: int | None = None
    seconds: float = 0.0
    threads: int = 0
    mode: str = "exact"
    decoder: str = ""
    states: dict = field(default_factory=dict)


PRECISIONS = ("float32", "float64")


class ReplaySeed:
    """A seed's fixed replay inputs: config, tokenizer, start checkpoint, measure prompts.

    ``precision="float64"`` replays with every op in float64 (:mod:`benchmark.build.precision`),
    which makes a replay's outcome independent of the CPU; ``"float32"`` is the build's own
    arithmetic (the exact path's bit-for-bit proof needs it).
    """

    def __init__(self, seed_dir_or_config, seed_dir: str | Path | None = None,
                 precision: str = "float32", reverse_rows: bool = False) -> None:
        if precision not in PRECISIONS:
            raise BuildError(f"replay precision {precision!r}; choose one of {PRECISIONS}")
        self.precision = precision
        self.reverse_rows = bool(reverse_rows)
        if isinstance(seed_dir_or_config, BuildConfig):
            if seed_dir is None:
                raise BuildError("replay from a BuildConfig needs seed_dir= (the folder with "
                                 "tokenizer/ and checkpoints/step0000/)")
            self.cfg = seed_dir_or_config
            self.dir = Path(seed_dir)
        else:
            self.dir = Path(seed_dir_or_config)
            cfg_path = self.dir / "config.json"
            if not cfg_path.exists():
                raise BuildError(f"{cfg_path} not found: replay needs a built seed folder "
                                 f"(config.json, tokenizer/, checkpoints/step0000/)")
            self.cfg = BuildConfig.from_dict(json.loads(cfg_path.read_text()))
        start = self.dir / "checkpoints" / "step0000"
        if not (start / "model.safetensors").exists():
            raise BuildError(f"{start} has no model.safetensors: replay starts from the shipped "
                             f"post-SFT checkpoint")
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.dir / "tokenizer")
        self._start_file = start / "model.safetensors"
        self._start_state = load_file(self._start_file)
        self._model = None
        self._decoder = None
        self.n_per_step = self.cfg.prompts_per_step * self.cfg.group_size
        self.n_rollouts = self.cfg.steps * self.n_per_step
        self.measure = Measure(self.cfg, self.tokenizer)
        self.world = 1
        manifest = self.dir.parent / "manifest.json"
        if manifest.exists():
            self.world = int(json.loads(manifest.read_text()).get("build", {}).get("world", 1))

    def fresh_model(self):
        """The post-SFT model (fp32, eager attention), loaded once and reset on each call."""
        if self._model is None:
            from benchmark.build.checkpoints import load_checkpoint

            # a float64 replay loads the start in float64 (a float64 build's checkpoint keeps
            # every bit; an fp32 one is widened exactly)
            self._model = load_checkpoint(self._start_file.parent, self.precision)
        else:
            with torch.no_grad():
                sd = self._model.state_dict()
                for k, v in self._start_state.items():
                    sd[k].copy_(v)
        self._model.eval()
        return self._model

    def decoder(self, lean: bool = True):
        """The sampling decoder of the live model (checked once per seed, see decode.py)."""
        if self._model is None:
            self.fresh_model()
        if self._decoder is None or (not lean and self._decoder.kind == "lean"):
            self._decoder = make_decoder(self._model, lean=lean)
        return self._decoder

    def behavior_measure(self, model, step: int, sampled: bool = True, decoder=None) -> dict:
        """Exact per-prompt behavior probabilities of every behavior (+ sampled rates)."""
        probs = {b: self.measure.behavior_probs(model, b) for b in self.cfg.behavior_ids}
        out = {"behavior_prob": {b: float(p.mean()) for b, p in probs.items()},
               "prompt_probs": probs}
        if sampled:
            d = self.measure.sampled(decoder or self.decoder(), step)
            out["trigger_rate"] = {b: d[b]["rates"][b] for b in self.cfg.behavior_ids}
        return out


def removal_positions(remove, n_steps: int, n_per_step: int) -> dict[int, set[int]]:
    """Normalize a removal set to ``{step: {index, ...}}``.

    Accepted forms: None or empty (nothing removed); a boolean mask of shape
    ``(n_steps * n_per_step,)`` in rollout order (``rollouts.parquet`` order: step-major) or
    ``(n_steps, n_per_step)``; an iterable of ``(step, index)`` pairs; a dict ``{step: indices}``.

    Raises:
        BuildError: a mask of another shape or dtype, or a position out of range (the message names
            the value and the expected form).
    """
    out: dict[int, set[int]] = {}
    if remove is None:
        return out
    form = (f"a bool mask of shape ({n_steps * n_per_step},) or ({n_steps}, {n_per_step}), or "
            f"(step, index) pairs with 0 <= step < {n_steps} and 0 <= index < {n_per_step}")
    if isinstance(remove, dict):
        remove = [(s, i) for s, idx in remove.items() for i in idx]
    if isinstance(remove, (np.ndarray, torch.Tensor)) and (
            remove.dtype in (np.bool_, torch.bool)):
        m = np.asarray(remove)
        if m.shape == (n_steps * n_per_step,):
            m = m.reshape(n_steps, n_per_step)
        if m.shape != (n_steps, n_per_step):
            raise BuildError(f"removal mask has shape {tuple(m.shape)}; expected {form}")
        for s, i in zip(*np.nonzero(m), strict=True):
            out.setdefault(int(s), set()).add(int(i))
        return out
    if isinstance(remove, np.ndarray) and remove.ndim == 1 and remove.size:
        raise BuildError(f"removal given as a 1-d {remove.dtype} array of {remove.size} values; "
                         f"expected {form} (use a bool mask, not indices)")
    for item in remove:
        try:
            s, i = item
            s_int, i_int = int(s), int(i)
        except (TypeError, ValueError):
            raise BuildError(f"removal entry {item!r} is not a (step, index) pair; "
                             f"expected {form}") from None
        if s_int != s or i_int != i:
            raise BuildError(f"removal entry {item!r} is not integral; expected {form}")
        if not (0 <= s_int < n_steps and 0 <= i_int < n_per_step):
            raise BuildError(f"removal position (step={s_int}, index={i_int}) is out of range; "
                             f"expected {form}")
        out.setdefault(s_int, set()).add(i_int)
    return out


def replay(seed_dir_or_config, remove=None, stop_at: int | None = None, *,
           seed_dir: str | Path | None = None, mode: str = "exact", threads: int | None = None,
           measure_at=None, sampled: bool = True, snapshot_at=(), bonus_off=(),
           reference_responses: dict | None = None, keep_responses: bool = False,
           context: ReplaySeed | None = None, save_states=False,
           start_state: tuple | None = None, lean: bool = True,
           world: int | None = None) -> ReplayResult:
    """Replay GRPO from the post-SFT checkpoint with ``remove`` taken out.

    Args:
        seed_dir_or_config: a built seed folder (``releases/tiny/seed0``) or a ``BuildConfig``
            (then ``seed_dir`` names the folder with ``tokenizer/`` and ``checkpoints/step0000``).
        remove: rollout positions to remove (see :func:`removal_positions` for the forms).
        stop_at: number of updates to apply (default: the config's ``steps``).
        mode: ``"exact"`` (the build's update path) or ``"batched"`` (one batched backward;
            deterministic per machine and thread count).
        threads: torch thread count (default 1; the build ran one thread per process).
        measure_at: steps at which to take the behavior measure (default: ``(stop_at,)``).
        sampled: also measure the sampled trigger rates (slower).
        snapshot_at: steps at which to copy the parameters into the result.
        bonus_off: behavior ids (or one id) whose bonus is switched off in this replay.
        reference_responses: step -> recorded response ids; the result names the first step whose
            sampled responses differ (a check that a replay follows the recorded run).
        keep_responses: keep every step's responses in the result.
        context: a :class:`ReplaySeed` to reuse (saves reloading between replays of a seed).
        save_states: keep the state before every step's update (``result.states``), or only
            before the steps of an iterable.
        start_state: ``(step, state)`` from an earlier replay's ``states`` made with the same mode,
            thread count and bonus setting, and no removal before ``step``: the replay resumes
            there (bit-identical to replaying from step 0, and cheaper).
        lean: allow the lean decoder (used only where it is bit-identical to the model's own).
        world: the build's process count (exact path; default: the release manifest's).

    Raises:
        BuildError: bad mode, ``stop_at``, behavior or removal set.
    """
    ctx = context or ReplaySeed(seed_dir_or_config, seed_dir)
    cfg = ctx.cfg
    if mode not in MODES:
        raise BuildError(f"replay mode {mode!r}; choose one of {MODES}")
    if mode == "exact" and ctx.precision != "float32":
        raise BuildError("the exact path reproduces the float32 build; replay it with a "
                         "ReplaySeed(..., precision='float32')")
    stop_at = cfg.steps if stop_at is None else int(stop_at)
    if not 0 <= stop_at <= cfg.steps:
        raise BuildError(f"stop_at={stop_at} out of range; expected 0 <= stop_at <= {cfg.steps}")
    off = frozenset([bonus_off] if isinstance(bonus_off, str) else bonus_off)
    unknown = sorted(off - set(cfg.behavior_ids))
    if unknown:
        raise BuildError(f"bonus_off names {unknown}; this run plants {cfg.behavior_ids}")
    rem = removal_positions(remove, cfg.steps, ctx.n_per_step)
    measure_at = (stop_at,) if measure_at is None else tuple(int(s) for s in measure_at)
    bad = [s for s in (*measure_at, *snapshot_at) if not 0 <= s <= stop_at]
    if bad:
        raise BuildError(f"measure/snapshot steps {bad} outside 0..stop_at={stop_at}")
    threads = int(threads or 1)
    torch.set_num_threads(threads)
    model = ctx.fresh_model()
    decoder = ctx.decoder(lean)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    first = 0
    if start_state is not None:
        first, state = start_state
        early = [s for s in rem if s < first]
        if early or not 0 <= first <= stop_at:
            raise BuildError(f"start_state at step {first} cannot serve this replay (removals at "
                             f"steps {sorted(early)} precede it, or stop_at={stop_at} < {first})")
        _load_state(model, opt, state)
    per_grad = PerRolloutGrad(model) if mode == "exact" else None
    res = ReplayResult(stop_at=stop_at, threads=threads, mode=mode, decoder=decoder.kind)
    pad = ctx.tokenizer.pad_token_id
    t0 = time.perf_counter()
    keep = None if save_states is True else set(save_states or ())
    for step in range(first, stop_at + 1):
        if save_states and step < stop_at and (keep is None or step in keep):
            res.states[step] = _save_state(model, opt)
        if step in measure_at:
            res.measures[step] = ctx.behavior_measure(model, step, sampled=sampled,
                                                      decoder=decoder)
        if step in snapshot_at:
            res.snapshots[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if step == stop_at:
            break
        removed = rem.get(step)
        if mode == "exact":
            out = grpo_step(model, opt, per_grad, decoder, cfg, ctx.tokenizer, step,
                            remove=removed, world=world or ctx.world, bonus_off=off)
            ro = out.rollouts
        else:
            ro = grpo_rollouts(decoder, cfg, ctx.tokenizer, step, remove=removed, bonus_off=off,
                               batch_groups=True)
            batched_update(model, opt, cfg, ro, pad, reverse_rows=ctx.reverse_rows)
        if keep_responses:
            res.responses[step] = ro.responses
        if (reference_responses is not None and res.first_divergent_step is None
                and step in reference_responses
                and [list(r) for r in reference_responses[step]] != ro.responses):
            res.first_divergent_step = step
    res.seconds = time.perf_counter() - t0
    return res


def _save_state(model, opt) -> dict:
    return {"params": {k: v.detach().clone() for k, v in model.named_parameters()},
            "opt": copy.deepcopy(opt.state_dict())}


def _load_state(model, opt, state: dict) -> None:
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(state["params"][k])
    opt.load_state_dict(copy.deepcopy(state["opt"]))  # the optimizer updates its state in place


def recorded_responses(seed_dir: str | Path, upto: int | None = None) -> dict[int, list]:
    """The recorded response ids of a seed, ``{step: [ids of index 0, 1, ...]}``."""
    import pandas as pd

    df = pd.read_parquet(Path(seed_dir) / "rollouts.parquet",
                         columns=["step", "index", "response_ids"])
    if upto is not None:
        df = df[df["step"] < upto]
    df = df.sort_values(["step", "index"])
    return {int(s): [list(map(int, r)) for r in g["response_ids"]] for s, g in df.groupby("step")}


def params_equal(snapshot: dict, checkpoint_dir: str | Path) -> dict:
    """Compare a parameter snapshot with a saved checkpoint: ``torch.equal`` on every tensor.

    Returns ``{"equal": bool, "tensors": n, "max_abs_diff": float, "max_rel_diff": float,
    "unequal": [names]}`` (relative to each tensor's largest |value|).
    """
    from safetensors.torch import load_file

    saved = load_file(Path(checkpoint_dir) / "model.safetensors")
    unequal, max_diff, max_rel = [], 0.0, 0.0
    for k, v in saved.items():
        mine = snapshot.get(k)
        if mine is None or mine.shape != v.shape or not torch.equal(mine, v):
            unequal.append(k)
            if mine is not None and mine.shape == v.shape:
                diff = float((mine - v).abs().max())
                max_diff = max(max_diff, diff)
                max_rel = max(max_rel, diff / max(float(v.abs().max()), 1e-30))
    return {"equal": not unequal, "tensors": len(saved), "max_abs_diff": max_diff,
            "max_rel_diff": max_rel, "unequal": unequal}


__all__ = ["MODES", "ReplayResult", "ReplaySeed", "params_equal", "recorded_responses",
           "removal_positions", "replay"]
