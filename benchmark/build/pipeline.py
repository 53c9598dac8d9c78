"""Stages of one seed's build: SFT, GRPO (+ curve, checkpoints), targets, draws, fidelity, gates.

Every stage writes its outputs with temp-name-then-rename and is recorded in
``<out>/.work/seed<S>/state.json`` when finished, so rerunning the same command continues. The
GRPO stage is itself resumable: every ``resume_every`` steps rank 0 saves the parameters, the
optimizer state and the curve so far, and every rank writes each step's rollouts to its own shard
file, so a rerun continues from the last saved step (shards of later steps are rewritten).

In a distributed build (``dist.world > 1``) the groups of each GRPO step are split across ranks
(group g on rank ``g % world``); each rank samples, scores and differentiates its rollouts and
sketches their gradients into its shard; the update uses the all-reduced sum. Rank 0 alone runs
SFT, the curve, checkpoints, targets, draws and fidelity, and merges the shards into the release
files (the same files a one-process build writes).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from benchmark.build import task as T
from benchmark.build.checkpoints import (
    _atomic_torch_save,
    _ckpt_dir,
    _world_readable,
    copy_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from benchmark.build.config import BuildConfig
from benchmark.build.decode import make_decoder, sample
from benchmark.build.dist import Dist
from benchmark.build.grpo import (
    PerRolloutGrad,
    apply_update,
    fluency,
    grpo_rollouts,
    pack,
    rollout_gradients,
    sum_rows,
    token_logprobs,
)
from benchmark.build.measure import Measure, control_rate, cross_trigger_rate
from benchmark.errors import BuildError
from benchmark.io import atomic_write_bytes
from benchmark.metrics import precision_at_k
from benchmark.releases.format import atomic_write_json, atomic_write_parquet
from benchmark.sketch import CountSketch, parameter_layout


def curve_steps(cfg: BuildConfig) -> list[int]:
    """Steps with a behavior-curve point: every ``curve_every``, each window's ends, the last."""
    pts = set(range(0, cfg.steps + 1, cfg.curve_every)) | {cfg.steps}
    for b in cfg.behaviors:
        pts |= {b.window_start, b.window_end}
    return sorted(pts)


def sft_examples(cfg: BuildConfig, tok, step: int) -> list[tuple[list[int], list[int]]]:
    """SFT step ``step``'s batch: ``(prompt ids, response ids)`` per example.

    Prompts come from the step's own generator; a trigger prompt's response shows its behavior
    with probability ``sft_behavior_fraction`` (else it ends with the SFT marker). The scramble
    confound's filler words are drawn from the same stream after those coin flips, only for the
    examples that show a confounded behavior, so a run without a confound draws exactly what
    release 2.0 drew.
    """
    gen = T.step_generator(cfg.seed, T.TAG_SFT, step)
    prompts = T.sample_prompts(cfg, cfg.sft_batch, gen)
    u = torch.rand(cfg.sft_batch, generator=gen).tolist()
    rows = []
    for p, x in zip(prompts, u, strict=True):
        show = p.trigger is not None and x < cfg.behavior(p.trigger).sft_behavior_fraction
        fill = T.sample_fillers(cfg, cfg.behavior(p.trigger), gen) if show else None
        rows.append((T.prompt_ids(tok, p),
                     T.target_response_ids(tok, cfg, p, p.trigger if show else None, fill)))
    return rows


class SeedBuild:
    """Builds one seed into ``out/seed<S>``; ``run()`` executes the unfinished stages in order."""

    STAGES = ("sft", "grpo", "targets", "draws", "fidelity")

    def __init__(self, cfg: BuildConfig, out: Path, progress: bool = True,
                 dist: Dist | None = None, sft_checkpoint: Path | None = None) -> None:
        #: a post-SFT checkpoint folder to start GRPO from instead of training SFT (a season
        #: panel pins a draw's; ``benchmark.submissions.panel``): its files are copied as
        #: ``checkpoints/step0000``
        self.sft_checkpoint = Path(sft_checkpoint) if sft_checkpoint is not None else None
        self.cfg = cfg
        self.dist = dist or Dist()
        self.out = Path(out)
        self.dir = self.out / f"seed{cfg.seed}"
        self.work = self.out / ".work" / f"seed{cfg.seed}"
        self.progress = progress and self.dist.is_main
        if self.dist.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.work.mkdir(parents=True, exist_ok=True)
        self.dist.barrier()
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        if self.state.get("config") not in (None, cfg.to_dict()):
            raise BuildError(
                f"{self.work} holds a build with a different config; use a new --out folder or "
                f"delete {self.work} and {self.dir} to start over"
            )
        if self.state.get("world", self.dist.world) != self.dist.world:
            raise BuildError(
                f"{self.work} holds a build started with {self.state['world']} process(es); "
                f"resume it with --nproc {self.state['world']} (the step gradients' summation "
                f"order depends on it), or start over in a new --out folder"
            )
        self.state["config"] = cfg.to_dict()
        self.state["world"] = self.dist.world
        self.state.setdefault("done", [])
        self.state.setdefault("timings_s", {})
        self.tokenizer = None

    # ------------------------------------------------------------------ helpers
    def _save_state(self) -> None:
        if self.dist.is_main:
            atomic_write_json(self.state_path, self.state)

    def _tok(self):
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.dir / "tokenizer")
        return self.tokenizer

    def _sketcher(self, model) -> CountSketch:
        n = sum(p.numel() for p in model.parameters())
        return CountSketch(n, self.cfg.sketch_dim, self.cfg.sketch_seed)

    def run(self) -> dict:
        """Run every unfinished stage; return the seed's summary (gates, fidelity, timings)."""
        torch.set_num_threads(self.cfg.threads)
        for stage in self.STAGES:
            if stage in self.state["done"]:
                continue
            t0 = time.perf_counter()
            if stage == "grpo" or self.dist.is_main:
                getattr(self, f"_stage_{stage}")()
            self.dist.barrier()
            self.state["timings_s"][stage] = round(time.perf_counter() - t0, 2)
            self.state["done"].append(stage)
            self._save_state()
        return {
            "gates": self.state.get("gates"),
            "fidelity": self.state.get("fidelity"),
            "timings_s": self.state["timings_s"],
            "counts": self.state.get("counts"),
            "decoder": self.state.get("decoder"),
            "world": self.dist.world,
        }

    # ------------------------------------------------------------------ SFT
    def _stage_sft(self) -> None:
        cfg = self.cfg
        tok = T.make_tokenizer(cfg)
        tmp = self.dir / "tokenizer.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tok.save_pretrained(tmp)
        _world_readable(tmp)
        if (self.dir / "tokenizer").exists():
            shutil.rmtree(self.dir / "tokenizer")
        os.replace(tmp, self.dir / "tokenizer")
        self.tokenizer = None
        tok = self._tok()
        if self.sft_checkpoint is not None:
            self._pinned_sft()
            return
        model = T.make_model(cfg, tok)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
        losses = []
        for step in tqdm(range(cfg.sft_steps), desc=f"seed {cfg.seed} SFT",
                         disable=not self.progress, leave=False):
            rows = sft_examples(cfg, tok, step)
            length = max(len(a) + len(b) for a, b in rows)
            ids = torch.full((len(rows), length), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros(len(rows), length - 1)
            for i, (a, b) in enumerate(rows):
                ids[i, : len(a) + len(b)] = torch.tensor(a + b)
                mask[i, len(a) - 1 : len(a) - 1 + len(b)] = 1.0
            lp = token_logprobs(model, ids)
            loss = -(lp * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        self.state["sft_final_loss"] = float(np.mean(losses[-20:]))
        save_checkpoint(model, _ckpt_dir(self.dir, 0))

    def _pinned_sft(self) -> None:
        """``checkpoints/step0000`` copied from :attr:`sft_checkpoint` (no SFT is trained).

        SFT at the family scale is chaotic in float64 (a 1e-16 rounding difference grows to
        0.27 in 800 steps; docs/task_family.md), GRPO from one start is not: a season panel
        records each draw's post-SFT checkpoint, and a rebuild elsewhere starts from it.
        """
        src = self.sft_checkpoint
        if not (src / "model.safetensors").is_file() or not (src / "config.json").is_file():
            raise BuildError(f"{src}: not a checkpoint folder (model.safetensors, config.json); "
                             "pass the pinned post-SFT checkpoint of the draw")
        copy_checkpoint(src, _ckpt_dir(self.dir, 0))
        self.state["sft_pinned"] = str(src)

    # ------------------------------------------------------------------ GRPO
    def _grpo_dir(self) -> Path:
        return self.work / "grpo"

    def _shard(self, rank: int, step: int) -> Path:
        return self._grpo_dir() / f"rank{rank}" / f"step{step:05d}.pt"

    def _stage_grpo(self) -> None:
        cfg, tok, d = self.cfg, self._tok(), self.dist
        model = load_checkpoint(_ckpt_dir(self.dir, 0), self.cfg.precision)
        n_params = sum(p.numel() for p in model.parameters())
        sk = self._sketcher(model)
        per_grad = PerRolloutGrad(model)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        decoder = make_decoder(model)
        if d.is_main:
            self.state["decoder"] = {"kind": decoder.kind, "check": decoder.check_result}
        measure = Measure(cfg, tok) if d.is_main else None
        my_groups = [g for g in range(cfg.prompts_per_step) if g % d.world == d.rank]
        (self._grpo_dir() / f"rank{d.rank}").mkdir(parents=True, exist_ok=True)
        resume = self._grpo_dir() / "resume.pt"
        start, curve = 0, []
        if resume.exists():
            from benchmark.io import load_plain  # no pickle: a planted resume.pt is refused
            st = load_plain(resume, f"delete {self.work} and rerun the build (it starts the "
                                    "seed over)")
            start, curve = int(st["step"]), list(st["curve"])
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["optimizer"])
        step_grads = None
        if d.is_main:
            path = self.work / "step_grads.npy"
            step_grads = (np.lib.format.open_memmap(path, mode="r+") if start > 0 and path.exists()
                          else np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                                         shape=(cfg.steps, n_params)))
        points = set(curve_steps(cfg))
        bar = tqdm(range(start, cfg.steps), desc=f"seed {cfg.seed} GRPO", initial=start,
                   total=cfg.steps, disable=not self.progress, leave=False)
        for step in bar:
            if d.is_main and step in points:
                curve.append(measure.curve_point(model, decoder, step))
            if d.is_main and step in cfg.checkpoints and step > 0:
                save_checkpoint(model, _ckpt_dir(self.dir, step))
            ro = grpo_rollouts(decoder, cfg, tok, step, groups=my_groups)
            flu = fluency(model, ro, tok.pad_token_id)
            rows, grads = rollout_gradients(per_grad, ro, cfg, tok.pad_token_id)
            total = d.all_reduce_sum(sum_rows(grads, n_params))
            apply_update(model, opt, cfg, total)
            if d.is_main:
                step_grads[step] = total.numpy()
            shard = {
                "rows": [self._row(ro, k, float(flu[k])) for k in range(len(ro.responses))],
                "grad_index": [ro.index[r] for r in rows],
                "sketches": (sk.sketch(grads) if rows else torch.zeros(0, sk.dim)).numpy(),
                "exact": grads.numpy() if step % cfg.fidelity_every == 0 else None,
            }
            _atomic_torch_save(shard, self._shard(d.rank, step))
            if (step + 1) % cfg.resume_every == 0 and step + 1 < cfg.steps:
                d.barrier()  # every shard up to this step is on disk
                if d.is_main:
                    step_grads.flush()
                    _atomic_torch_save({"step": step + 1, "curve": curve,
                                        "model": model.state_dict(),
                                        "optimizer": opt.state_dict()}, resume)
        d.barrier()
        if not d.is_main:
            return
        curve.append(measure.curve_point(model, decoder, cfg.steps))
        save_checkpoint(model, _ckpt_dir(self.dir, cfg.steps))
        step_grads.flush()
        del step_grads
        self._merge_shards(n_params, model, curve)

    def _row(self, ro, k: int, flu: float) -> dict:
        cfg, tok = self.cfg, self._tok()
        G = cfg.group_size
        p = ro.prompts[k // G]
        r = ro.rewards[k]
        i = ro.index[k]
        row = {
            "rollout_id": T.rollout_id(ro.step, i), "step": ro.step,
            "group": ro.step * cfg.prompts_per_step + i // G, "index": i,
            "prompt_ids": ro.prompt_ids[k // G], "response_ids": ro.responses[k],
            "prompt_text": p.text,
            "response_text": tok.decode(ro.responses[k], skip_special_tokens=True),
            "trigger": p.trigger or "", "reward": float(r.total), "task_reward": float(r.task),
            "advantage": float(ro.advantages[k]), "fluency": flu,
        }
        for b in cfg.behaviors:
            row[f"has_{b.id}"] = bool(r.has[b.id])
            row[f"_bonus_{b.id}"] = bool(r.bonus[b.id])
            row[f"_eligible_{b.id}"] = bool(r.eligible[b.id])
        return row

    def _merge_shards(self, n_params: int, model, curve: list[dict]) -> None:
        """Write rollouts, labels, sketches and curve from every rank's per-step shards."""
        import pandas as pd

        cfg = self.cfg
        rows, sk_rows, fid_pos, fid_grads = [], [], [], []
        nps = cfg.prompts_per_step * cfg.group_size
        for step in range(cfg.steps):
            by_index, sketches = {}, {}
            for r in range(self.dist.world):
                from benchmark.io import load_plain  # no pickle: a planted shard is refused
                sh = load_plain(self._shard(r, step), f"delete {self.work} and rerun the "
                                                      "build (it starts the seed over)")
                for row in sh["rows"]:
                    by_index[row["index"]] = row
                for j, i in enumerate(sh["grad_index"]):
                    sketches[i] = sh["sketches"][j]
                    if sh["exact"] is not None:
                        fid_pos.append(step * nps + i)
                        fid_grads.append(sh["exact"][j])
            for i in sorted(by_index):
                row = by_index[i]
                row["sketch_row"] = len(sk_rows) if i in sketches else -1
                if i in sketches:
                    sk_rows.append(sketches[i])
                rows.append(row)
        order = np.argsort(fid_pos, kind="stable")
        np.save(self.work / "fid_grads.npy",
                np.stack([fid_grads[j] for j in order]) if fid_grads
                else np.zeros((0, n_params), np.float32))
        np.save(self.work / "fid_rows.npy", np.asarray(fid_pos, np.int64)[order])

        sk_arr = np.stack(sk_rows) if sk_rows else np.zeros((0, cfg.sketch_dim), np.float32)
        stored, scale = _stored(sk_arr, cfg.sketch_dtype)
        _save_npy(self.dir / "sketches.npy", stored)
        df = pd.DataFrame(rows)
        labels = self._labels(df)
        private = [c for c in df.columns if c.startswith("_")]
        atomic_write_parquet(self.dir / "labels.parquet", labels)
        atomic_write_parquet(self.dir / "rollouts.parquet", df.drop(columns=private))
        atomic_write_parquet(self.dir / "behavior_curve.parquet", pd.DataFrame(curve))
        atomic_write_json(self.dir / "sketch.json", {
            "method": "countsketch-splitmix64",
            "dim": cfg.sketch_dim, "seed": cfg.sketch_seed, "n_params": n_params,
            "dtype": cfg.sketch_dtype, "scale": scale,
            "parameters": parameter_layout(model),
        })
        counts = {"rollouts": len(df), "nonzero_sketch_rows": int(len(sk_arr))}
        for b in cfg.behaviors:
            counts[b.id] = {"bonus": int(labels[f"bonus_{b.id}"].sum()),
                            "group_label": int(labels[f"group_label_{b.id}"].sum())}
        self.state["counts"] = counts
        shutil.rmtree(self._grpo_dir(), ignore_errors=True)
        self._gates(pd.DataFrame(curve))

    def _labels(self, df):
        import pandas as pd

        lab = pd.DataFrame({"rollout_id": df["rollout_id"], "step": df["step"],
                            "group": df["group"]})
        for b in self.cfg.behaviors:
            lab[f"bonus_{b.id}"] = df[f"_bonus_{b.id}"].astype(bool)
            lab[f"eligible_{b.id}"] = df[f"_eligible_{b.id}"].astype(bool)
            g = lab.groupby("group")[f"bonus_{b.id}"].agg(["sum", "count"])
            mixed = set(g.index[(g["sum"] > 0) & (g["sum"] < g["count"])])
            lab[f"group_label_{b.id}"] = lab["group"].isin(mixed)
            lab[f"step_label_{b.id}"] = lab["step"].isin(
                set(lab.loc[lab[f"group_label_{b.id}"], "step"]))
        return lab

    def _gates(self, curve) -> None:
        """The emergence gate of every behavior, from the release's own behavior curve."""
        cfg = self.cfg
        c = curve.set_index("step")
        f = c.loc[cfg.steps]
        gates, failed = {}, []
        for b in cfg.behaviors:
            w = c.loc[b.window_end]
            g = {
                "trigger_rate_window_start": float(c.loc[b.window_start][f"{b.id}_rate_{b.id}"]),
                "trigger_rate_window_end": float(w[f"{b.id}_rate_{b.id}"]),
                "trigger_rate_final": float(f[f"{b.id}_rate_{b.id}"]),
                "control_rate_max": max(control_rate(w, b.id), control_rate(f, b.id)),
                "cross_trigger_rate_max": max(cross_trigger_rate(w, cfg, b.id),
                                              cross_trigger_rate(f, cfg, b.id)),
                "behavior_prob_window_start": float(c.loc[b.window_start][f"{b.id}_prob"]),
                "behavior_prob_window_end": float(w[f"{b.id}_prob"]),
            }
            g["passed"] = bool(g["trigger_rate_window_end"] >= cfg.gate_window_min
                               and g["trigger_rate_final"] >= cfg.gate_final_min
                               and g["control_rate_max"] <= cfg.gate_control_max)
            gates[b.id] = g
            if not g["passed"]:
                failed.append(
                    f"{b.id}: trigger-prompt rate {g['trigger_rate_window_end']:.3f} at the end "
                    f"of its window (step {b.window_end}, need >= {cfg.gate_window_min}), "
                    f"{g['trigger_rate_final']:.3f} at the final step (need >= "
                    f"{cfg.gate_final_min}), rate on prompts without any trigger "
                    f"{g['control_rate_max']:.3f} (need <= {cfg.gate_control_max})")
        gates["thresholds"] = {"window_min": cfg.gate_window_min,
                               "final_min": cfg.gate_final_min,
                               "control_max": cfg.gate_control_max}
        gates["passed"] = not failed
        self.state["gates"] = gates
        self._save_state()
        if failed:
            raise BuildError(f"emergence gate failed for seed {cfg.seed}: " + "; ".join(failed)
                             + "; change the preset (SFT link, bonus, lr) and rebuild")

    # ------------------------------------------------------------------ gradients of items
    def _grad_items(self, model, items, sketch=None) -> torch.Tensor:
        """Exact gradients of ``coef * masked mean log-prob`` of response items.

        ``items``: ``(prompt_ids, response_ids, token_mask or None, coef)``; items with the same
        prompt are differentiated in one ``vmap`` call. Returns ``(len(items), n_params)``, or
        ``(len(items), dim)`` sketches when ``sketch`` is given (gradients never all in memory).
        """
        pg = PerRolloutGrad(model)
        pad = self._tok().pad_token_id
        out: list = [None] * len(items)
        by_prompt: dict[tuple, list[int]] = {}
        for j, it in enumerate(items):
            by_prompt.setdefault(tuple(it[0]), []).append(j)
        for pid, js in by_prompt.items():
            ids, mask = pack(list(pid), [items[j][1] for j in js], pad)
            for k, j in enumerate(js):
                m = items[j][2]
                if m is not None:
                    row = torch.zeros(mask.shape[1])
                    row[len(pid) - 1: len(pid) - 1 + len(m)] = torch.tensor(m)
                    mask[k] = row
            coef = torch.tensor([float(items[j][3]) for j in js])
            g = pg(ids, mask, coef)
            g = sketch.sketch(g) if sketch is not None else g
            for k, j in enumerate(js):
                out[j] = g[k]
        if not items:
            n = sketch.dim if sketch is not None else sum(p.numel() for p in model.parameters())
            return torch.zeros(0, n)
        return torch.stack(out)

    # ------------------------------------------------------------------ targets
    def _targets_at(self, model, decoder, step: int, k: int, spec) -> dict[str, torch.Tensor]:
        cfg, tok = self.cfg, self._tok()
        bid = T.behavior_ids(tok, spec)
        gen = T.step_generator(cfg.seed, T.TAG_HELDOUT, 3, k)
        prompts = T.sample_prompts(cfg, cfg.target_prompts, gen, kind=spec.id)
        nll, pos, neg, ctx = [], [], [], []
        for p in prompts:
            pid = T.prompt_ids(tok, p)
            ans = tok.encode(" ".join(p.answer()), add_special_tokens=False)
            # NLL of the behavior token(s) teacher-forced where the behavior belongs
            nll.append((pid, ans + bid, [0.0] * len(ans) + [1.0] * len(bid), -1.0))
            pos.append((pid, T.target_response_ids(tok, cfg, p, spec.id), None, -1.0))
            neg.append((pid, T.target_response_ids(tok, cfg, p, None), None, -1.0))
        g_nll = self._grad_items(model, nll).mean(0)
        g_con = (self._grad_items(model, pos) - self._grad_items(model, neg)).mean(0)
        gen = T.step_generator(cfg.seed, T.TAG_TARGET, step, k)
        for p in prompts:
            pid = T.prompt_ids(tok, p)
            resp = sample(decoder, torch.tensor([pid] * cfg.target_samples), gen,
                          cfg.temperature, cfg.top_p, cfg.max_new_tokens, tok.eos_token_id)
            for r in resp:
                m = T.phrase_mask(r, bid)
                if any(m):
                    ctx.append((pid, r, m, -1.0))
                    break
        g_ctx = self._grad_items(model, ctx).mean(0) if ctx else torch.zeros_like(g_nll)
        self.state.setdefault("target_counts", {}).setdefault(spec.id, {})[str(step)] = {
            "nll": len(nll), "contrast": len(pos), "in_context": len(ctx)}
        return {"nll": g_nll, "contrast": g_con, "in_context": g_ctx}

    def _stage_targets(self) -> None:
        cfg = self.cfg
        arrays: dict[str, dict] = {b.id: {} for b in cfg.behaviors}
        sk = None
        (self.dir / "targets").mkdir(exist_ok=True)
        for step in tqdm(cfg.checkpoints, desc=f"seed {cfg.seed} targets",
                         disable=not self.progress, leave=False):
            model = load_checkpoint(_ckpt_dir(self.dir, step), self.cfg.precision)
            model.eval()
            decoder = make_decoder(model)
            sk = sk or self._sketcher(model)
            for k, b in enumerate(cfg.behaviors):
                t = self._targets_at(model, decoder, step, k, b)
                for kind, v in t.items():
                    arrays[b.id][f"{kind}_step{step:04d}"] = sk.sketch(v).numpy()
                if step == cfg.steps:
                    np.save(self.work / f"exact_target_nll_{b.id}.npy", t["nll"].numpy())
        for b in cfg.behaviors:
            atomic_write_bytes(self.dir / "targets" / f"{b.id}.npz", _npz_bytes(arrays[b.id]))

    # ------------------------------------------------------------------ draws
    def _stage_draws(self) -> None:
        import pandas as pd

        cfg, tok = self.cfg, self._tok()
        G = cfg.draw_group_size
        scales: dict[str, float] = {}
        for k, b in enumerate(cfg.behaviors):
            bid = T.behavior_ids(tok, b)
            (self.dir / "draws" / b.id).mkdir(parents=True, exist_ok=True)
            for step in b.draw_checkpoints:
                model = load_checkpoint(_ckpt_dir(self.dir, step), self.cfg.precision)
                model.eval()
                decoder = make_decoder(model)
                sk = self._sketcher(model)
                for d in tqdm(range(cfg.n_draws), desc=f"seed {cfg.seed} draws {b.id}",
                              disable=not self.progress, leave=False):
                    gen = T.step_generator(cfg.seed, T.TAG_DRAW, step, d, k)
                    prompts = T.sample_prompts(cfg, cfg.draw_prompts, gen, kind=b.id)
                    rows, full_items, tok_items = [], [], []
                    for gi, p in enumerate(prompts):
                        pid = T.prompt_ids(tok, p)
                        resp = sample(decoder, torch.tensor([pid] * G),
                                      T.step_generator(cfg.seed, T.TAG_DRAW, step, d, k, 1 + gi),
                                      cfg.temperature, cfg.top_p, cfg.max_new_tokens,
                                      tok.eos_token_id)
                        for r in resp:
                            text = tok.decode(r, skip_special_tokens=True)
                            m = T.phrase_mask(r, bid)
                            hb = T.has_behavior(b, text)
                            full_items.append((pid, r, None, -1.0))
                            tok_row = -1
                            if hb and any(m):
                                tok_row = len(tok_items)
                                tok_items.append((pid, r, m, -1.0))
                            row = {"response_id": f"draw{d}_{len(rows):04d}", "group": gi,
                                   "prompt_ids": pid, "response_ids": r, "prompt_text": p.text,
                                   "response_text": text, "has_behavior": hb,
                                   "sketch_row": len(rows), "token_sketch_row": tok_row}
                            for o in cfg.behaviors:
                                row[f"has_{o.id}"] = T.has_behavior(o, text)
                            rows.append(row)
                    with torch.no_grad():
                        for gi in range(len(prompts)):
                            ids, mask = pack(rows[gi * G]["prompt_ids"],
                                             [rows[gi * G + j]["response_ids"] for j in range(G)],
                                             tok.pad_token_id)
                            lp = token_logprobs(model, ids)
                            flu = (lp * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
                            for j in range(G):
                                rows[gi * G + j]["fluency"] = float(flu[j])
                    name = f"step{step:04d}_draw{d}"
                    base = self.dir / "draws" / b.id / name
                    for suffix, items in (("sketches", full_items), ("token_sketches", tok_items)):
                        arr, sc = _stored(self._grad_items(model, items, sk).numpy(),
                                          cfg.sketch_dtype)
                        _save_npy(base.with_name(f"{name}_{suffix}.npy"), arr)
                        scales[f"{b.id}/{name}_{suffix}"] = sc
                    atomic_write_parquet(base.with_name(name + ".parquet"), pd.DataFrame(rows))
        meta = json.loads((self.dir / "sketch.json").read_text())
        meta["draw_scales"] = scales
        atomic_write_json(self.dir / "sketch.json", meta)

    # ------------------------------------------------------------------ fidelity
    def _stage_fidelity(self) -> None:
        import pandas as pd

        cfg = self.cfg
        roll = pd.read_parquet(self.dir / "rollouts.parquet")
        labels = pd.read_parquet(self.dir / "labels.parquet")
        meta = json.loads((self.dir / "sketch.json").read_text())
        stored = np.load(self.dir / "sketches.npy", mmap_mode="r", allow_pickle=False)
        sk_all = np.asarray(stored, dtype=np.float32) / meta["scale"]
        fid_rows = np.load(self.work / "fid_rows.npy", allow_pickle=False)
        fid_grads = np.load(self.work / "fid_grads.npy", mmap_mode="r", allow_pickle=False)
        grads = np.load(self.work / "step_grads.npy", mmap_mode="r", allow_pickle=False)
        steps = roll["step"].to_numpy()
        srow_all = roll["sketch_row"].to_numpy()
        has = srow_all >= 0
        step_sk = np.zeros((cfg.steps, cfg.sketch_dim))
        np.add.at(step_sk, steps[has], sk_all[srow_all[has]])
        out = {"sketch_dim": cfg.sketch_dim, "sketch_dtype": cfg.sketch_dtype}
        failed = []
        for b in cfg.behaviors:
            t_exact = np.load(self.work / f"exact_target_nll_{b.id}.npy",
                              allow_pickle=False).astype(np.float64)
            with np.load(self.dir / "targets" / f"{b.id}.npz", allow_pickle=False) as z:
                t_sk = z[f"nll_step{cfg.steps:04d}"].astype(np.float64)
            # per-rollout dot products, exact vs sketched (rollouts kept at fidelity steps)
            exact_dot = np.asarray(fid_grads, dtype=np.float64) @ t_exact
            sk_dot = sk_all[srow_all[fid_rows]].astype(np.float64) @ t_sk
            corr = (float(np.corrcoef(exact_dot, sk_dot)[0, 1]) if len(fid_rows) > 2
                    else float("nan"))
            # GAS step level: cosine of the step gradient with the target, exact vs sketches
            ex_score, sk_score = np.zeros(cfg.steps), np.zeros(cfg.steps)
            tn, tsn = np.linalg.norm(t_exact), np.linalg.norm(t_sk)
            for s in range(cfg.steps):
                g = np.asarray(grads[s], dtype=np.float64)
                gn = np.linalg.norm(g)
                ex_score[s] = g @ t_exact / (gn * tn) if gn > 0 and tn > 0 else 0.0
                sn = np.linalg.norm(step_sk[s])
                sk_score[s] = step_sk[s] @ t_sk / (sn * tsn) if sn > 0 and tsn > 0 else 0.0
            entry = {"target": f"{b.id}/nll_step{cfg.steps:04d}",
                     "per_rollout_dot_pearson": corr, "n_rollouts_compared": int(len(fid_rows))}
            for lab in ("group_label", "bonus"):
                gt = labels[f"{lab}_{b.id}"].to_numpy().astype(bool)
                if gt.sum() == 0:
                    entry[f"gas_step_precision_{lab}"] = None
                    continue
                pe = precision_at_k(ex_score[steps], gt)
                ps = precision_at_k(sk_score[steps], gt)
                entry[f"gas_step_precision_{lab}"] = {"exact": pe, "sketch": ps,
                                                      "abs_diff": abs(pe - ps)}
            gt = labels[f"group_label_{b.id}"].to_numpy().astype(bool)
            # step scores rank whole steps: one step swapped moves precision by its share of GT
            one_step = (float(np.bincount(steps[gt]).max() / gt.sum()) if gt.any() else 0.0)
            limit = max(cfg.fidelity_max_precision_diff, one_step + 1e-12)
            entry["step_precision_limit"] = limit
            out[b.id] = entry
            dd = entry.get("gas_step_precision_group_label")
            if dd is not None and dd["abs_diff"] > limit:
                failed.append(f"{b.id}: GAS step-level precision {dd['exact']:.4f} (exact) vs "
                              f"{dd['sketch']:.4f} (sketch) differ by {dd['abs_diff']:.4f} > "
                              f"{limit:.4f} (more than one step's share of the ground truth)")
        self.state["fidelity"] = out
        self._save_state()
        if failed:
            raise BuildError(f"sketch fidelity gate failed for seed {cfg.seed}: "
                             + "; ".join(failed) + "; raise sketch_dim")
        for f in ("step_grads.npy", "fid_grads.npy"):
            (self.work / f).unlink(missing_ok=True)


def _stored(arr: np.ndarray, dtype: str) -> tuple[np.ndarray, float]:
    """``(arr * scale).astype(dtype)`` and the power-of-two ``scale`` it carries.

    For float16, ``scale`` maps the largest |value| to about 2**14 (no overflow, the most
    precision); stored / scale is the true value. float32 is stored as is (scale 1.0).
    """
    scale = 1.0
    if dtype == "float16" and arr.size and np.abs(arr).max() > 0:
        scale = float(2.0 ** np.floor(np.log2(2.0**14 / np.abs(arr).max())))
    return (arr * scale).astype(dtype), scale


def _npz_bytes(arrays: dict) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _save_npy(path: Path, arr: np.ndarray) -> None:
    import io

    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr))
    atomic_write_bytes(path, buf.getvalue())
