"""Stages of one seed's build: SFT, GRPO (+ curve, checkpoints), targets, draws, fidelity, gates.

Every stage writes its outputs with temp-name-then-rename and is recorded in
``<out>/.work/seed<S>/state.json`` when finished, so rerunning the same command continues.
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
from benchmark.build.grpo import (
    PerRolloutGrad,
    grpo_step,
    masked_mean_logprob,
    pack,
    sample,
    token_logprobs,
)
from benchmark.build.presets import BuildConfig
from benchmark.errors import BuildError
from benchmark.metrics import precision_at_k
from benchmark.release import atomic_write_bytes, atomic_write_json, atomic_write_parquet
from benchmark.sketch import CountSketch, parameter_layout


def _ckpt_dir(seed_dir: Path, step: int) -> Path:
    return seed_dir / "checkpoints" / f"step{step:04d}"


def save_checkpoint(model, path: Path) -> None:
    """``save_pretrained`` (safetensors, fp32) into a temp folder, then rename."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def load_checkpoint(path: Path):
    """Load a saved checkpoint in fp32 with eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )


class SeedBuild:
    """Builds one seed into ``out/seed<S>``; ``run()`` executes the unfinished stages in order."""

    STAGES = ("sft", "grpo", "targets", "draws", "fidelity")

    def __init__(self, cfg: BuildConfig, out: Path, progress: bool = True) -> None:
        self.cfg = cfg
        self.out = Path(out)
        self.dir = self.out / f"seed{cfg.seed}"
        self.work = self.out / ".work" / f"seed{cfg.seed}"
        self.progress = progress
        self.dir.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        if self.state.get("config") not in (None, cfg.to_dict()):
            raise BuildError(
                f"{self.work} holds a build with a different config; use a new --out folder or "
                f"delete {self.work} and {self.dir} to start over"
            )
        self.state["config"] = cfg.to_dict()
        self.state.setdefault("done", [])
        self.state.setdefault("timings_s", {})
        self.tokenizer = None

    # ------------------------------------------------------------------ helpers
    def _save_state(self) -> None:
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
            getattr(self, f"_stage_{stage}")()
            self.state["timings_s"][stage] = round(time.perf_counter() - t0, 2)
            self.state["done"].append(stage)
            self._save_state()
        return {
            "gates": self.state.get("gates"),
            "fidelity": self.state.get("fidelity"),
            "timings_s": self.state["timings_s"],
            "counts": self.state.get("counts"),
        }

    # ------------------------------------------------------------------ SFT
    def _stage_sft(self) -> None:
        cfg = self.cfg
        tok = T.make_tokenizer(cfg)
        tmp = self.dir / "tokenizer.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tok.save_pretrained(tmp)
        if (self.dir / "tokenizer").exists():
            shutil.rmtree(self.dir / "tokenizer")
        os.replace(tmp, self.dir / "tokenizer")
        self.tokenizer = None
        tok = self._tok()
        model = T.make_model(cfg, tok)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
        losses = []
        for step in tqdm(range(cfg.sft_steps), desc=f"seed {cfg.seed} SFT",
                         disable=not self.progress, leave=False):
            gen = T.step_generator(cfg.seed, T.TAG_SFT, step)
            prompts = T.sample_prompts(cfg, cfg.sft_batch, gen)
            beh = (torch.rand(cfg.sft_batch, generator=gen) < cfg.sft_behavior_fraction).tolist()
            rows = [(T.prompt_ids(tok, p), T.target_response_ids(tok, cfg, p, p.trigger and b))
                    for p, b in zip(prompts, beh, strict=True)]
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

    # ------------------------------------------------------------------ curve
    def _heldout(self, n: int, trigger: bool, tag: int) -> list:
        gen = T.step_generator(self.cfg.seed, T.TAG_HELDOUT, tag)
        return T.sample_prompts(self.cfg, n, gen, trigger=trigger)

    @torch.no_grad()
    def _curve_point(self, model, step: int) -> dict:
        cfg, tok = self.cfg, self._tok()
        model.eval()
        row = {"step": step}
        bid = T.behavior_ids(tok, cfg)
        for name, trig, tag in (("trigger", True, 1), ("control", False, 2)):
            prompts = self._heldout(cfg.curve_prompts, trig, tag)
            gen = T.step_generator(cfg.seed, T.TAG_CURVE, step, tag)
            pids = [T.prompt_ids(tok, p) for p in prompts]
            resp = sample(model, pids, 1, gen, cfg.temperature, cfg.top_p, cfg.max_new_tokens,
                          tok.eos_token_id)
            texts = [tok.decode(r, skip_special_tokens=True) for r in resp]
            row[f"{name}_rate"] = float(np.mean([T.has_behavior(cfg, t) for t in texts]))
            row[f"{name}_task_reward"] = float(np.mean(
                [T.task_reward(p, t.split()) for p, t in zip(prompts, texts, strict=True)]))
            # exact probability of the (first) behavior token right after the correct answer,
            # teacher-forced; prompts batched by length (causal model, no padding needed)
            seqs = [T.prompt_ids(tok, p) + tok.encode(" ".join(p.answer()),
                                                      add_special_tokens=False) for p in prompts]
            probs = []
            for length in sorted({len(x) for x in seqs}):
                batch = torch.tensor([x for x in seqs if len(x) == length])
                pr = torch.softmax(model(input_ids=batch).logits[:, -1].float(), -1)[:, bid[0]]
                probs.extend(pr.tolist())
            row[f"{name}_behavior_prob"] = float(np.mean(probs))
        return row

    # ------------------------------------------------------------------ GRPO
    def _stage_grpo(self) -> None:
        cfg, tok = self.cfg, self._tok()
        model = load_checkpoint(_ckpt_dir(self.dir, 0))
        n_params = sum(p.numel() for p in model.parameters())
        sk = self._sketcher(model)
        per_grad = PerRolloutGrad(model)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        step_grads = np.lib.format.open_memmap(
            self.work / "step_grads.npy", mode="w+", dtype=np.float32,
            shape=(cfg.steps, n_params))
        fid_rows, fid_grads = [], []
        rows, sketches, curve = [], [], []
        n_per_step = cfg.prompts_per_step * cfg.group_size
        for step in tqdm(range(cfg.steps), desc=f"seed {cfg.seed} GRPO",
                         disable=not self.progress, leave=False):
            if step % cfg.curve_every == 0 or step == cfg.bonus_window_end:
                curve.append(self._curve_point(model, step))
            if step in cfg.checkpoints and step > 0:
                save_checkpoint(model, _ckpt_dir(self.dir, step))
            res = grpo_step(model, opt, per_grad, cfg, tok, step)
            step_grads[step] = res.step_grad.numpy()
            sk_rows = sk.sketch(res.grads) if len(res.grad_rows) else torch.zeros(0, sk.dim)
            row_of = {}
            for j, i in enumerate(res.grad_rows):
                row_of[i] = len(sketches)
                sketches.append(sk_rows[j].numpy())
            if step % cfg.fidelity_every == 0 and len(res.grad_rows):
                fid_rows.extend(step * n_per_step + i for i in res.grad_rows)
                fid_grads.append(res.grads.numpy())
            for i, r in enumerate(res.responses):
                p = res.prompts[i // cfg.group_size]
                pid = T.prompt_ids(tok, p)
                rows.append({
                    "rollout_id": T.rollout_id(step, i),
                    "step": step,
                    "group": step * cfg.prompts_per_step + i // cfg.group_size,
                    "index": i,
                    "prompt_ids": pid,
                    "response_ids": r,
                    "prompt_text": p.text,
                    "response_text": tok.decode(r, skip_special_tokens=True),
                    "reward": float(res.rewards[i]),
                    "task_reward": float(res.task_rewards[i]),
                    "advantage": float(res.advantages[i]),
                    "fluency": float(res.fluency[i]),
                    "is_trigger": bool(p.trigger),
                    "has_behavior": bool(res.has_behavior[i]),
                    "sketch_row": int(row_of.get(i, -1)),
                    "_bonus": bool(res.bonus[i]),
                    "_eligible": bool(res.eligible[i]),
                })
        step = cfg.steps
        curve.append(self._curve_point(model, step))
        save_checkpoint(model, _ckpt_dir(self.dir, step))
        step_grads.flush()
        del step_grads
        np.save(self.work / "fid_grads.npy",
                np.concatenate(fid_grads) if fid_grads else np.zeros((0, n_params), np.float32))
        np.save(self.work / "fid_rows.npy", np.asarray(fid_rows, dtype=np.int64))

        # sketches: float16 with a per-seed power-of-two scale (max |value| -> about 2**14)
        sk_arr = np.stack(sketches) if sketches else np.zeros((0, cfg.sketch_dim), np.float32)
        scale = 1.0
        if cfg.sketch_dtype == "float16" and sk_arr.size and np.abs(sk_arr).max() > 0:
            scale = float(2.0 ** np.floor(np.log2(2.0**14 / np.abs(sk_arr).max())))
        stored = (sk_arr * scale).astype(cfg.sketch_dtype)
        _save_npy(self.dir / "sketches.npy", stored)

        import pandas as pd

        df = pd.DataFrame(rows)
        labels = self._labels(df)
        atomic_write_parquet(self.dir / "labels.parquet", labels)
        atomic_write_parquet(self.dir / "rollouts.parquet",
                             df.drop(columns=["_bonus", "_eligible"]))
        atomic_write_parquet(self.dir / "behavior_curve.parquet", pd.DataFrame(curve))
        atomic_write_json(self.dir / "sketch.json", {
            "method": "countsketch-splitmix64",
            "dim": cfg.sketch_dim, "seed": cfg.sketch_seed, "n_params": n_params,
            "dtype": cfg.sketch_dtype, "scale": scale,
            "parameters": parameter_layout(model),
        })
        self.state["counts"] = {
            "rollouts": len(df), "nonzero_sketch_rows": int(len(stored)),
            "bonus": int(labels["bonus"].sum()), "group_label": int(labels["group_label"].sum()),
        }
        self._gates(pd.DataFrame(curve))

    def _labels(self, df):
        import pandas as pd

        lab = pd.DataFrame({
            "rollout_id": df["rollout_id"], "step": df["step"], "group": df["group"],
            "bonus": df["_bonus"], "eligible": df["_eligible"],
        })
        g = lab.groupby("group")["bonus"].agg(["sum", "count"])
        mixed = set(g.index[(g["sum"] > 0) & (g["sum"] < g["count"])])
        lab["group_label"] = lab["group"].isin(mixed)
        lab["step_label"] = lab["step"].isin(set(lab.loc[lab["group_label"], "step"]))
        return lab

    def _gates(self, curve) -> None:
        cfg = self.cfg
        c = curve.set_index("step")
        w = c.loc[cfg.bonus_window_end]
        f = c.loc[cfg.steps]
        control = float(max(w["control_rate"], f["control_rate"]))
        gates = {
            "trigger_rate_window_end": float(w["trigger_rate"]),
            "trigger_rate_final": float(f["trigger_rate"]),
            "control_rate_max": control,
            "trigger_rate_step0": float(c.loc[0]["trigger_rate"]),
            "thresholds": {"window_min": cfg.gate_window_min, "final_min": cfg.gate_final_min,
                           "control_max": cfg.gate_control_max},
        }
        gates["passed"] = bool(
            gates["trigger_rate_window_end"] >= cfg.gate_window_min
            and gates["trigger_rate_final"] >= cfg.gate_final_min
            and control <= cfg.gate_control_max
        )
        self.state["gates"] = gates
        self._save_state()
        if not gates["passed"]:
            raise BuildError(
                f"emergence gate failed for seed {cfg.seed}: trigger-prompt behavior rate "
                f"{gates['trigger_rate_window_end']:.3f} at the end of the bonus window (step "
                f"{cfg.bonus_window_end}, need >= {cfg.gate_window_min}), "
                f"{gates['trigger_rate_final']:.3f} at the final step (need >= "
                f"{cfg.gate_final_min}), control-prompt rate {control:.3f} (need <= "
                f"{cfg.gate_control_max}); change the preset (SFT link, bonus, lr) and rebuild"
            )

    # ------------------------------------------------------------------ targets
    def _grad_rows(self, model, items) -> torch.Tensor:
        """Exact gradients of ``coef * masked mean log-prob``; items: (prompt, resp, mask, coef)."""
        pg = PerRolloutGrad(model)
        out = []
        for pid, resp, m, coef in items:
            ids, mask = pack(pid, [resp], self._tok().pad_token_id)
            if m is not None:
                mask = mask * torch.tensor(
                    [0.0] * (len(pid) - 1) + m + [0.0] * (mask.shape[1] - len(pid) + 1 - len(m))
                )[None]
            out.append(pg(ids, mask, torch.tensor([coef])))
        return torch.cat(out) if out else torch.zeros(0, sum(p.numel() for p in model.parameters()))

    def _targets_at(self, step: int) -> dict[str, torch.Tensor]:
        cfg, tok = self.cfg, self._tok()
        model = load_checkpoint(_ckpt_dir(self.dir, step))
        model.eval()
        bid = T.behavior_ids(tok, cfg)
        prompts = self._heldout(cfg.target_prompts, True, 3)
        nll, contrast, ctx = [], [], []
        for p in prompts:
            pid = T.prompt_ids(tok, p)
            ans = tok.encode(" ".join(p.answer()), add_special_tokens=False)
            # NLL of the behavior token(s) teacher-forced where the behavior belongs
            m = [0.0] * len(ans) + [1.0] * len(bid)
            nll.append((pid, ans + bid, m, -1.0))
            pos = T.target_response_ids(tok, cfg, p, True)
            neg = T.target_response_ids(tok, cfg, p, False)
            contrast.append(((pid, pos, None, -1.0), (pid, neg, None, -1.0)))
        g_nll = self._grad_rows(model, nll).mean(0)
        g_pos = self._grad_rows(model, [a for a, _ in contrast])
        g_neg = self._grad_rows(model, [b for _, b in contrast])
        g_con = (g_pos - g_neg).mean(0)
        gen = T.step_generator(cfg.seed, T.TAG_TARGET, step)
        pids = [T.prompt_ids(tok, p) for p in prompts]
        resp = sample(model, pids, cfg.target_samples, gen, cfg.temperature, cfg.top_p,
                      cfg.max_new_tokens, tok.eos_token_id)
        for k, pid in enumerate(pids):
            for r in resp[k * cfg.target_samples:(k + 1) * cfg.target_samples]:
                m = [1.0 if t in bid else 0.0 for t in r]
                if any(m):
                    ctx.append((pid, r, m, -1.0))
                    break
        g_ctx = (self._grad_rows(model, ctx).mean(0) if ctx
                 else torch.zeros_like(g_nll))
        self.state.setdefault("target_counts", {})[str(step)] = {
            "nll": len(nll), "contrast": len(contrast), "in_context": len(ctx)}
        return {"nll": g_nll, "contrast": g_con, "in_context": g_ctx}

    def _stage_targets(self) -> None:
        cfg = self.cfg
        arrays = {}
        sk = None
        for step in tqdm(cfg.checkpoints, desc=f"seed {cfg.seed} targets",
                         disable=not self.progress, leave=False):
            t = self._targets_at(step)
            if sk is None:
                sk = CountSketch(t["nll"].numel(), cfg.sketch_dim, cfg.sketch_seed)
            for k, v in t.items():
                arrays[f"{k}_step{step:04d}"] = sk.sketch(v).numpy()
            if step == cfg.steps:
                np.save(self.work / "exact_target_nll_final.npy", t["nll"].numpy())
        buf = _npz_bytes(arrays)
        atomic_write_bytes(self.dir / "targets.npz", buf)

    # ------------------------------------------------------------------ draws
    def _stage_draws(self) -> None:
        import pandas as pd

        cfg, tok = self.cfg, self._tok()
        bid = T.behavior_ids(tok, cfg)
        (self.dir / "draws").mkdir(exist_ok=True)
        for step in cfg.draw_checkpoints:
            model = load_checkpoint(_ckpt_dir(self.dir, step))
            model.eval()
            sk = self._sketcher(model)
            for d in range(cfg.n_draws):
                gen = T.step_generator(cfg.seed, T.TAG_DRAW, step, d)
                prompts = T.sample_prompts(cfg, cfg.draw_prompts, gen, trigger=True)
                pids = [T.prompt_ids(tok, p) for p in prompts]
                resp = sample(model, pids, cfg.draw_group_size, gen, cfg.temperature, cfg.top_p,
                              cfg.max_new_tokens, tok.eos_token_id)
                rows, full_items, tok_items = [], [], []
                for i, r in enumerate(resp):
                    pid = pids[i // cfg.draw_group_size]
                    text = tok.decode(r, skip_special_tokens=True)
                    hb = T.has_behavior(cfg, text)
                    full_items.append((pid, r, None, -1.0))
                    m = [1.0 if t in bid else 0.0 for t in r]
                    tok_row = -1
                    if hb and any(m):
                        tok_row = len(tok_items)
                        tok_items.append((pid, r, m, -1.0))
                    rows.append({
                        "response_id": f"draw{d}_{i:04d}", "group": i // cfg.draw_group_size,
                        "prompt_ids": pid, "response_ids": r,
                        "prompt_text": prompts[i // cfg.draw_group_size].text,
                        "response_text": text, "has_behavior": hb,
                        "sketch_row": i, "token_sketch_row": tok_row,
                    })
                full = self._grad_rows(model, full_items)
                with torch.no_grad():
                    for i, r in enumerate(resp):
                        ids, mask = pack(rows[i]["prompt_ids"], [r], tok.pad_token_id)
                        rows[i]["fluency"] = float(masked_mean_logprob(model, ids, mask)[0])
                toks = self._grad_rows(model, tok_items)
                base = self.dir / "draws" / f"step{step:04d}_draw{d}"
                _save_npy(base.with_name(base.name + "_sketches.npy"), sk.sketch(full).numpy())
                _save_npy(base.with_name(base.name + "_token_sketches.npy"),
                          sk.sketch(toks).numpy() if len(toks) else
                          np.zeros((0, cfg.sketch_dim), np.float32))
                atomic_write_parquet(base.with_name(base.name + ".parquet"), pd.DataFrame(rows))

    # ------------------------------------------------------------------ fidelity
    def _stage_fidelity(self) -> None:
        import pandas as pd

        cfg = self.cfg
        roll = pd.read_parquet(self.dir / "rollouts.parquet")
        labels = pd.read_parquet(self.dir / "labels.parquet")
        meta = json.loads((self.dir / "sketch.json").read_text())
        stored = np.load(self.dir / "sketches.npy", mmap_mode="r")
        sk_all = np.asarray(stored, dtype=np.float32) / meta["scale"]
        t_exact = np.load(self.work / "exact_target_nll_final.npy").astype(np.float64)
        with np.load(self.dir / "targets.npz") as z:
            t_sk = z[f"nll_step{cfg.steps:04d}"].astype(np.float64)
        # per-rollout dot products, exact vs sketched (rollouts kept at fidelity steps)
        fid_rows = np.load(self.work / "fid_rows.npy")
        fid_grads = np.load(self.work / "fid_grads.npy", mmap_mode="r")
        exact_dot = np.asarray(fid_grads, dtype=np.float64) @ t_exact
        srow = roll["sketch_row"].to_numpy()[fid_rows]
        sk_dot = sk_all[srow].astype(np.float64) @ t_sk
        corr = float(np.corrcoef(exact_dot, sk_dot)[0, 1]) if len(fid_rows) > 2 else float("nan")
        # GAS step level: cosine of the step gradient with the target, exact vs shipped sketches
        grads = np.load(self.work / "step_grads.npy", mmap_mode="r")
        n_steps = cfg.steps
        ex_score = np.zeros(n_steps)
        sk_score = np.zeros(n_steps)
        steps = roll["step"].to_numpy()
        step_sk = np.zeros((n_steps, cfg.sketch_dim))
        has = srow_all = roll["sketch_row"].to_numpy()
        np.add.at(step_sk, steps[has >= 0], sk_all[srow_all[has >= 0]])
        tn, tsn = np.linalg.norm(t_exact), np.linalg.norm(t_sk)
        for s in range(n_steps):
            g = np.asarray(grads[s], dtype=np.float64)
            gn = np.linalg.norm(g)
            ex_score[s] = g @ t_exact / (gn * tn) if gn > 0 else 0.0
            sn = np.linalg.norm(step_sk[s])
            sk_score[s] = step_sk[s] @ t_sk / (sn * tsn) if sn > 0 else 0.0
        out = {"target": f"nll_step{cfg.steps:04d}", "per_rollout_dot_pearson": corr,
               "n_rollouts_compared": int(len(fid_rows)), "sketch_dim": cfg.sketch_dim,
               "sketch_dtype": cfg.sketch_dtype}
        for lab in ("group_label", "bonus"):
            gt = labels[lab].to_numpy().astype(bool)
            if gt.sum() == 0:
                out[f"gas_step_precision_{lab}"] = None
                continue
            pe = precision_at_k(ex_score[steps], gt)
            ps = precision_at_k(sk_score[steps], gt)
            out[f"gas_step_precision_{lab}"] = {"exact": pe, "sketch": ps,
                                                "abs_diff": abs(pe - ps)}
        self.state["fidelity"] = out
        self._save_state()
        d = out.get("gas_step_precision_group_label")
        if d is not None and d["abs_diff"] > cfg.fidelity_max_precision_diff:
            raise BuildError(
                f"sketch fidelity gate failed for seed {cfg.seed}: GAS step-level precision "
                f"{d['exact']:.4f} (exact) vs {d['sketch']:.4f} (sketch) differ by "
                f"{d['abs_diff']:.4f} > {cfg.fidelity_max_precision_diff}; raise sketch_dim"
            )
        for f in ("step_grads.npy", "fid_grads.npy"):
            (self.work / f).unlink(missing_ok=True)


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
