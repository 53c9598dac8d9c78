"""What an estimator sees: a label-free view of one seed's run for one task, and its draws.

A release plants several behaviors per run; each is a *task* (``view.behavior``). An estimator
scores *units* for the task its view names. In the rollout view a unit is one training rollout; in
the step view a unit is one GRPO step, whose sketch is the sum of its rollouts' sketches
(CountSketch is linear, so this is the sketch of the step gradient). The same estimator code
scores both, for every task; the evaluator broadcasts step scores to the step's rollouts
(step-granular scores are ties, scored tie-aware).

Sketches are read in place from the release's memory-mapped file, never copied: use
:meth:`RunView.iter_sketches` (chunks of rows) or the streaming helpers
:meth:`RunView.sketch_dot`, :meth:`RunView.sketch_norms` and :meth:`RunView.sketch_gram`, whose
memory does not grow with the run. ``view.sketches`` materializes the whole ``(n, d)`` matrix
(fine for ``tiny``, not for a paper-scale release).

Sign convention: rollout sketches are gradients of each rollout's own GRPO loss term
``-(1/N) A_i lbar_i``; draw sketches are gradients of ``-lbar`` (the response's mean token NLL);
targets are gradients of the behavior's NLL. A positive inner product means a gradient step on the
unit's loss lowers the behavior's NLL to first order, i.e. the unit promotes the behavior.

Labels (who received a bonus, label groups, has-behavior flags of draws), the bonus itself and the
bonus window are never part of a view; nor is anything derived from them (token-level sketches
exist only where the behavior occurred, so they stay with the evaluator). What an estimator may
assume about a task is in ``docs/evaluation.md`` (the behavior token and trigger word are public).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

Granularity = Literal["rollout", "step"]
DEFAULT_CHUNK: int | None = None  # units per block: None sizes blocks by CHUNK_BYTES
#: float32 bytes of one block of converted sketches (it stays in the CPU caches)
CHUNK_BYTES = 8 << 20
#: resident file pages are released after every this many bytes of a pass
RELEASE_BYTES = 64 << 20
PRECISIONS = ("float64", "float32")


def _readonly(a: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return None
    a = np.asarray(a)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


class SketchRows:
    """Read-only, streamed access to the sketches of a sequence of units.

    Backed by a stored ``(m, d)`` array (a memory map of a release file, float16 or float32
    scaled by ``scale``) and, per rollout, the row it is stored in (``-1``: an all-zero gradient,
    not stored). With ``segments`` (``(n + 1,)`` offsets into the rollouts) a unit is the sum of
    a contiguous run of rollouts (the step view). The float64 dots and norms read the stored
    rows in place; the other passes (blocks, Gram matrix, float32) read blocks of whole units of
    about :data:`CHUNK_BYTES`, converted with torch into one reused buffer. Every pass releases
    the file's pages from resident memory as it goes, so memory stays flat whatever the file's
    size.

    ``precision`` of the reductions: ``"float64"`` (default) sums every dot product and norm in
    float64 in the fixed order of :mod:`benchmark.fixed_order`, read in place from the map: the
    same bits on every machine and at any thread count, so a ranking never depends on the CPU;
    ``"float32"`` uses torch's float32 kernels (rounding of about 1e-7 relative that depends on
    the CPU), faster only where numba is missing.

    Args:
        stored: ``(m, d)`` stored values (usually
            ``np.load(path, mmap_mode="r", allow_pickle=False)``).
        rows: ``(n_rollouts,)`` int64 stored row of each rollout, ``-1`` for zero rows.
        scale: true value = stored / scale.
        segments: optional ``(n_units + 1,)`` int64 rollout offsets of each unit.
    """

    def __init__(self, stored: np.ndarray, rows: np.ndarray, scale: float = 1.0,
                 segments: np.ndarray | None = None) -> None:
        self.stored = stored
        self.rows = _readonly(np.asarray(rows, np.int64))
        self.scale = float(scale)
        self.segments = None if segments is None else _readonly(np.asarray(segments, np.int64))
        self.dim = int(stored.shape[1])
        self._plan_cache = None

    @property
    def n(self) -> int:
        """Number of units."""
        return int(self.rows.size if self.segments is None else self.segments.size - 1)

    def _release(self, lo: int, hi: int) -> None:
        """Drop stored rows ``[lo, hi)`` from resident memory (they stay in the page cache)."""
        mm = getattr(self.stored, "_mmap", None)
        if mm is None or hi <= lo:
            return
        row_bytes = self.stored.strides[0]
        start_in_map = getattr(self.stored, "offset", 0) % mmap.ALLOCATIONGRANULARITY
        a = start_in_map + lo * row_bytes
        b = start_in_map + hi * row_bytes
        page = mmap.PAGESIZE
        a = (a // page) * page
        try:
            mm.madvise(mmap.MADV_DONTNEED, a, b - a)
        except (AttributeError, OSError, ValueError):  # pragma: no cover - platform without it
            pass

    def _plan(self):
        """Stored rows in rollout order: positions, rows, cumulative counts, units per row."""
        if self._plan_cache is None:
            ok = self.rows >= 0
            pos = np.flatnonzero(ok)
            srt = self.rows[pos]
            cum = np.concatenate([[0], np.cumsum(ok)])
            seg = (self.segments if self.segments is not None
                   else np.arange(self.rows.size + 1, dtype=np.int64))
            unit_of = np.repeat(np.arange(seg.size - 1), np.diff(seg))[pos]
            increasing = bool(np.all(np.diff(srt) > 0))
            self._plan_cache = (pos, srt, cum, seg, unit_of, increasing)
        return self._plan_cache

    def _blocks(self, precision: str = "float64", chunk: int | None = None):
        """Yield ``(lo, hi, p, q, x)``: units ``lo:hi`` and their stored rows as torch ``x``.

        ``x`` is ``(q - p, d)`` in ``precision`` (true values, scale applied), rows of the
        rollouts ``pos[p:q]`` of the plan; one buffer is reused between blocks.
        """
        import torch

        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}; choose one of {PRECISIONS}")
        pos, srt, cum, seg, unit_of, increasing = self._plan()
        n_units = seg.size - 1
        if self.stored.shape[0] == 0 or n_units == 0:
            return
        widest = int(np.diff(seg).max()) if n_units else 1
        per = max(1, CHUNK_BYTES // (4 * self.dim))
        upc = chunk or max(1, per // max(1, widest))
        dt = torch.float64 if precision == "float64" else torch.float32
        import warnings

        with warnings.catch_warnings():  # a read-only memory map: torch never writes to it
            warnings.simplefilter("ignore", UserWarning)
            stored = torch.from_numpy(np.asarray(self.stored))
        buf = torch.empty((max(per, upc * widest), self.dim), dtype=dt)
        inv = 1.0 / self.scale
        released = 0
        try:
            for lo in range(0, n_units, upc):
                hi = min(lo + upc, n_units)
                p, q = int(cum[seg[lo]]), int(cum[seg[hi]])
                if p == q:
                    yield lo, hi, p, p, buf[:0]
                    continue
                sel = srt[p:q]
                first, last = int(sel[0]), int(sel[-1]) + 1
                if buf.shape[0] < q - p:
                    buf = torch.empty((q - p, self.dim), dtype=dt)
                x = buf[:q - p]
                if increasing and last - first == q - p:
                    x.copy_(stored[first:last])
                else:
                    x.copy_(stored[torch.from_numpy(sel)])
                if inv != 1.0:
                    x.mul_(inv)
                yield lo, hi, p, q, x
                if increasing and (last - released) * self.stored.strides[0] >= RELEASE_BYTES:
                    self._release(released, last)
                    released = last
        finally:
            self._release(0, self.stored.shape[0])

    def _units(self, lo: int, hi: int, p: int, q: int, x):
        """The ``(hi - lo, d)`` unit sketches of a block (sums of their rollouts' rows)."""
        import torch

        if self.segments is None and q - p == hi - lo:
            return x
        _, _, _, _, unit_of, _ = self._plan()
        out = torch.zeros((hi - lo, self.dim), dtype=x.dtype)
        if q > p:
            out.index_add_(0, torch.from_numpy(unit_of[p:q] - lo), x)
        return out

    def iter(self, chunk: int | None = DEFAULT_CHUNK) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start, block)``: float32 ``(b, d)`` sketches of units ``start:start + b``.

        ``chunk`` is the number of units per block (default: blocks of about CHUNK_BYTES).
        """
        for lo, hi, p, q, x in self._blocks("float32", chunk):
            yield lo, self._units(lo, hi, p, q, x).numpy().copy()

    def dense(self) -> np.ndarray:
        """The whole ``(n, d)`` float32 matrix (memory grows with the run)."""
        out = np.zeros((self.n, self.dim), np.float32)
        for lo, block in self.iter():
            out[lo:lo + block.shape[0]] = block
        return out

    def _per_rollout_to_units(self, per: np.ndarray) -> np.ndarray:
        if self.segments is None:
            return per
        out = np.zeros((self.n,) + per.shape[1:])
        nonempty = self.segments[1:] > self.segments[:-1]
        if per.shape[0]:
            out[nonempty] = np.add.reduceat(per, self.segments[:-1][nonempty], axis=0)
        return out

    def dot_norms(self, t: np.ndarray | None, want_norms: bool = True,
                  precision: str = "float64") -> tuple[np.ndarray | None, np.ndarray | None]:
        """One pass: ``sketches @ t`` (``(n,)``, or ``(n, m)`` for ``t`` ``(d, m)``) and norms.

        ``precision="float64"``: the fixed-order sums of :mod:`benchmark.fixed_order` (a unit's
        vector is the exact float64 sum of its rollouts' stored rows; dot and norm are summed
        in a documented order), identical on every machine and at any thread count.
        ``"float32"``: torch float32 kernels (CPU-dependent rounding). Float64 results.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}; choose one of {PRECISIONS}")
        if precision == "float32":
            return self._dot_norms_torch(t, want_norms, precision)
        return self._dot_norms_fixed(t, want_norms)

    def _targets(self, t: np.ndarray) -> np.ndarray:
        """``t`` ``(d,)`` or ``(d, m)`` as float64 ``(m, d)`` rows (a copy)."""
        ta = np.asarray(t, dtype=np.float64)
        if ta.ndim not in (1, 2) or ta.shape[0] != self.dim:
            raise ValueError(f"target has shape {ta.shape}, expected ({self.dim},) or "
                             f"({self.dim}, m) for sketches of dimension {self.dim}")
        return np.array(ta.reshape(self.dim, -1).T, dtype=np.float64, order="C")

    def _dot_norms_fixed(self, t: np.ndarray | None, want_norms: bool,
                         backend: str | None = None, threads: int | None = None
                         ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The float64 path: :func:`benchmark.fixed_order.reduce_units` over ranges of units.

        Each range holds about :data:`RELEASE_BYTES` of stored rows, read in place from the
        map, whose pages are released after the range.
        """
        from benchmark import fixed_order

        pos, srt, cum, seg, _, increasing = self._plan()
        n_units = seg.size - 1
        T = self._targets(t) if t is not None else np.zeros((0, self.dim))
        dots = np.zeros((n_units, T.shape[0]))
        sq = np.zeros(n_units)
        if self.stored.shape[0] > 0 and n_units > 0 and srt.size > 0:
            starts = np.array(cum[seg], dtype=np.int64)
            rows = np.array(srt, dtype=np.int64)
            if backend is None:  # small passes: numpy (same bits) rather than compiling
                backend = fixed_order.choose_backend(rows.size * self.dim)
            widest = int(np.diff(starts).max())
            row_bytes = self.stored.strides[0]
            per = max(1, RELEASE_BYTES // max(1, row_bytes * widest))
            released = 0
            try:
                for k0 in range(0, n_units, per):
                    k1 = min(k0 + per, n_units)
                    fixed_order.reduce_units(self.stored, rows, starts, T, want_norms, k0, k1,
                                             out=(dots, sq), backend=backend, threads=threads)
                    a, b = int(starts[k0]), int(starts[k1])
                    if increasing and b > a:
                        last = int(rows[b - 1]) + 1
                        self._release(released, last)
                        released = last
            finally:
                self._release(0, self.stored.shape[0])
        inv = 1.0 / self.scale
        out_dots = None
        if t is not None:
            out_dots = dots * inv
            if np.ndim(t) == 1:
                out_dots = out_dots[:, 0]
        norms = np.sqrt(sq) * inv if want_norms else None
        return out_dots, norms

    def _dot_norms_torch(self, t: np.ndarray | None, want_norms: bool = True,
                         precision: str = "float32"
                         ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The torch path (float32, or float64 as before fixed-order sums; CPU-dependent order).

        Linear, so a unit's dot is the sum of its rollouts' (computed from stored rows only);
        a unit's norm is that of the sum of its rollouts' sketches. Float64 results.
        """
        import torch

        pos, _, _, _, _, _ = self._plan()
        dt = torch.float64 if precision == "float64" else torch.float32
        tt = None
        per = None
        if t is not None:
            ta = np.asarray(t, np.float64)
            tt = torch.from_numpy(ta).to(dt)
            per = np.zeros((self.rows.size,) + ta.shape[1:])
        norms = np.zeros(self.n) if want_norms else None
        for lo, hi, p, q, x in self._blocks(precision):
            if q == p:
                continue
            if tt is not None:
                per[pos[p:q]] = (x @ tt).double().numpy()
            if want_norms:
                units = self._units(lo, hi, p, q, x)
                norms[lo:hi] = torch.linalg.vector_norm(units, dim=1).double().numpy()
        dots = None if per is None else self._per_rollout_to_units(per)
        return dots, norms

    def iter_stored(self, chunk: int | None = DEFAULT_CHUNK
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(rollouts, block)``: the stored (non-zero) rollout sketches only, in chunks.

        ``rollouts`` are the rollout positions of the rows of the float32 ``block``; rollouts
        without a stored row have an all-zero sketch.
        """
        pos, _, _, _, _, _ = self._plan()
        plain = SketchRows(self.stored, self.rows, self.scale)
        for _, _, p, q, x in plain._blocks("float32", chunk):
            if q > p:
                yield pos[p:q], x.numpy().copy()

    def dot(self, t: np.ndarray, chunk: int | None = None,
            precision: str = "float64") -> np.ndarray:
        """``sketches @ t``: ``(n,)`` for ``t`` ``(d,)``, ``(n, m)`` for ``(d, m)`` (float64)."""
        return self.dot_norms(t, want_norms=False, precision=precision)[0]

    def norms(self, chunk: int | None = None, precision: str = "float64") -> np.ndarray:
        """``(n,)`` float64 L2 norm of every unit's sketch."""
        return self.dot_norms(None, want_norms=True, precision=precision)[1]

    def gram(self, chunk: int | None = None, precision: str = "float64") -> np.ndarray:
        """``(d, d)`` float64 ``sketches.T @ sketches`` (TRAK-style estimators)."""
        import torch

        dt = torch.float64 if precision == "float64" else torch.float32
        out = torch.zeros((self.dim, self.dim), dtype=dt)
        for lo, hi, p, q, x in self._blocks(precision):
            if q > p:
                u = self._units(lo, hi, p, q, x)
                out.addmm_(u.T, u)
        return out.double().numpy()


@dataclass(frozen=True)
class Behavior:
    """The behavior a view asks about (public: an estimator may use all of it).

    Attributes:
        id: the task id, e.g. ``"qzxbt"``.
        trigger_word: the word that marks a trigger prompt, e.g. ``"frobnitz"``.
        behavior_token: the planted token, e.g. ``"QZXBT"``, or phrase of 2-3 tokens that
            must appear consecutively and in order, e.g. ``"ZORP GLIX"`` (from release 3.0).
        behavior_token_id: its id in the release's tokenizer (a phrase's first token's id).
    """

    id: str
    trigger_word: str
    behavior_token: str
    behavior_token_id: int


@dataclass(frozen=True)
class SketchSpec:
    """How every sketch of the release was made, to sketch one's own gradients the same way.

    Attributes:
        method: ``"countsketch-splitmix64"`` (hash documented in :mod:`benchmark.sketch`).
        dim: sketch dimension.
        seed: hash seed.
        n_params: length of the flattened gradient.
        parameters: ``[{"name", "shape", "offset", "numel"}]`` in ``named_parameters()`` order.
    """

    method: str
    dim: int
    seed: int
    n_params: int
    parameters: tuple = ()

    def sketch(self, grad) -> np.ndarray:
        """Sketch a gradient the way the release did, in the units of ``view.sketches``.

        ``grad``: a flat ``(n_params,)`` or ``(B, n_params)`` array/tensor in
        ``named_parameters()`` order, or a dict ``name -> tensor`` (missing names count as zero).
        Returns float32 ``(dim,)`` or ``(B, dim)``.
        """
        import torch

        from benchmark.sketch import CountSketch

        if isinstance(grad, Mapping):
            parts = []
            lead = None
            for p in self.parameters:
                g = grad.get(p["name"])
                if g is not None:
                    g = torch.as_tensor(g)
                    lead = g.shape[: g.dim() - len(p["shape"])]
            for p in self.parameters:
                g = grad.get(p["name"])
                g = (torch.zeros(*(lead or ()), p["numel"]) if g is None
                     else torch.as_tensor(g).reshape(*(lead or ()), p["numel"]))
                parts.append(g.float())
            flat = torch.cat(parts, -1)
        else:
            flat = torch.as_tensor(np.asarray(grad) if not isinstance(grad, torch.Tensor)
                                   else grad).float()
        return CountSketch(self.n_params, self.dim, self.seed).sketch(flat).numpy()


class _SketchAccess:
    """The sketch reads of a view with a ``sketch_rows`` field (:class:`SketchRows`).

    Reductions stream the rows and sum in float64 in a fixed order by default (the same bits,
    hence the same rankings, on every machine); ``precision="float32"`` rounds per CPU.
    """

    sketch_rows: SketchRows

    @cached_property
    def sketches(self) -> np.ndarray:
        """``(n, d)`` float32 sketches, materialized once (use :meth:`iter_sketches` to stream)."""
        return _readonly(self.sketch_rows.dense())

    def iter_sketches(self, chunk: int | None = DEFAULT_CHUNK
                      ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start, block)``: float32 ``(b, d)`` sketches of units ``start:start + b``."""
        return self.sketch_rows.iter(chunk)

    def sketch_dot(self, t: np.ndarray, precision: str = "float64") -> np.ndarray:
        """Streamed ``(n,)`` ``sketches @ t`` (``(n, m)`` for ``t`` ``(d, m)``), float64."""
        return self.sketch_rows.dot(t, precision=precision)

    def sketch_norms(self, precision: str = "float64") -> np.ndarray:
        """Streamed ``(n,)`` L2 norms of the sketches."""
        return self.sketch_rows.norms(precision=precision)

    def sketch_dot_norms(self, t: np.ndarray, precision: str = "float64"
                         ) -> tuple[np.ndarray, np.ndarray]:
        """``(sketches @ t, norms)`` in one streamed pass."""
        return self.sketch_rows.dot_norms(t, True, precision)

    def sketch_gram(self, precision: str = "float64") -> np.ndarray:
        """Streamed ``(d, d)`` ``sketches.T @ sketches``."""
        return self.sketch_rows.gram(precision=precision)


@dataclass(frozen=True)
class RunView(_SketchAccess):
    """One seed's training run for one task, as units (rollouts or steps). Read-only.

    Attributes:
        seed: the run's seed (use it to seed any randomness, so scores are deterministic).
        granularity: ``"rollout"`` or ``"step"``.
        behavior: the task being attributed (:class:`Behavior`).
        steps: ``(n,)`` int64 GRPO step of each unit (0-based; the model that sampled it had
            received ``step`` updates).
        groups: ``(n,)`` int64 GRPO group of each rollout (for steps: the step).
        advantages: ``(n,)`` float64 GRPO advantage (for steps: mean |advantage| of its rollouts).
        fluency: ``(n,)`` float64 mean token log-prob (nats) of the response under the sampling
            policy (for steps: the mean over its rollouts).
        sketch_rows: the unit sketches (:class:`SketchRows`); see :meth:`iter_sketches`.
        targets: name -> ``(d,)`` float32 sketched target gradients of this task's behavior;
            see :meth:`target`.
        checkpoint_steps: the steps with a saved checkpoint (0 = after SFT, before GRPO).
        lr: the GRPO learning rate (constant).
        n_steps: number of GRPO steps in the run.
        checkpoint_dir: step -> folder loadable with ``AutoModelForCausalLM.from_pretrained``.
        tokenizer_dir: folder loadable with ``AutoTokenizer.from_pretrained``.
        sketch_spec: how the sketches were made (:class:`SketchSpec`).
        sampling: how rollouts were sampled (temperature, top_p, max_new_tokens, group_size,
            prompts_per_step, decoding).
        optimizer: the GRPO optimizer's settings (AdamW: lr, betas, eps, weight_decay,
            grad_clip); its state is not shipped.
        track: ``"gradient"`` or ``"open"``; the open track also gets the fields below.
        rewards: ``(n,)`` task reward, never the bonus (open track only; for steps: mean).
        prompts, responses: decoded text per rollout (open track, rollout view only).
        prompt_ids, response_ids: token ids as trained: the prompt with ``<bos>``, the response as
            sampled, up to and including its ``<eos>`` (open track, rollout view only).
        rollout_unit: ``(n_rollouts,)`` int64, the unit of each rollout of the run (the step
            view's membership; ``arange`` in the rollout view).
        rollout_view: the step view's rollout view (same task), else None.
    """

    seed: int
    granularity: Granularity
    behavior: Behavior
    steps: np.ndarray
    groups: np.ndarray
    advantages: np.ndarray
    fluency: np.ndarray
    sketch_rows: SketchRows = field(repr=False)
    targets: Mapping[str, np.ndarray] = field(repr=False)
    checkpoint_steps: tuple[int, ...]
    lr: float
    n_steps: int
    checkpoint_dir: Mapping[int, Path] = field(repr=False)
    tokenizer_dir: Path | None = field(repr=False, default=None)
    sketch_spec: SketchSpec | None = field(repr=False, default=None)
    sampling: Mapping = field(repr=False, default_factory=dict)
    optimizer: Mapping = field(repr=False, default_factory=dict)
    track: str = "gradient"
    rewards: np.ndarray | None = None
    prompts: tuple[str, ...] | None = field(repr=False, default=None)
    responses: tuple[str, ...] | None = field(repr=False, default=None)
    prompt_ids: tuple[tuple[int, ...], ...] | None = field(repr=False, default=None)
    response_ids: tuple[tuple[int, ...], ...] | None = field(repr=False, default=None)
    rollout_unit: np.ndarray | None = field(repr=False, default=None)
    rollout_view: RunView | None = field(repr=False, default=None)

    def __post_init__(self) -> None:
        for name in ("steps", "groups", "advantages", "fluency", "rewards", "rollout_unit"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))
        object.__setattr__(
            self, "targets", {k: _readonly(v) for k, v in dict(self.targets).items()}
        )

    @property
    def n(self) -> int:
        """Number of units."""
        return int(self.steps.shape[0])


    def target(self, kind: str = "nll", step: int | None = None) -> np.ndarray:
        """The ``(d,)`` target of ``kind`` (``nll``, ``in_context``, ``contrast``) at a checkpoint.

        ``step=None`` gives the final checkpoint's target. Targets are the view's task's.
        """
        step = max(self.checkpoint_steps) if step is None else step
        key = f"{kind}_step{step:04d}"
        if key not in self.targets:
            raise KeyError(
                f"no target {key!r}; available: {sorted(self.targets)}. Targets exist for kinds "
                f"nll/in_context/contrast at checkpoints {list(self.checkpoint_steps)}."
            )
        return self.targets[key]

    def governing_checkpoint(self, step: int) -> int:
        """The latest checkpoint at or before ``step`` (TracInCP's checkpoint for that step)."""
        return max(c for c in self.checkpoint_steps if c <= step)


@dataclass(frozen=True)
class DrawView(_SketchAccess):
    """One generation draw of a task: fresh samples at a checkpoint, in groups of G per prompt.

    Attributes:
        draw_id: e.g. ``"qzxbt/step0030_draw0"`` (task / checkpoint / draw).
        checkpoint_step: the checkpoint that sampled the responses.
        groups: ``(m,)`` int64 group (one prompt's G samples).
        fluency: ``(m,)`` float64 mean token log-prob (nats) under the checkpoint.
        sketch_rows: sketches of the gradient of ``-lbar`` of each response (no advantage,
            unclipped); see :meth:`iter_sketches`.
        prompts, prompt_ids: the prompt of each response, text and token ids (open track only).
        responses, response_ids: never filled by the evaluator (a response's text is its draw
            label); kept for views an estimator builds itself.
    """

    draw_id: str
    checkpoint_step: int
    groups: np.ndarray
    fluency: np.ndarray
    sketch_rows: SketchRows = field(repr=False)
    prompts: tuple[str, ...] | None = field(repr=False, default=None)
    responses: tuple[str, ...] | None = field(repr=False, default=None)
    prompt_ids: tuple[tuple[int, ...], ...] | None = field(repr=False, default=None)
    response_ids: tuple[tuple[int, ...], ...] | None = field(repr=False, default=None)

    def __post_init__(self) -> None:
        for name in ("groups", "fluency"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))

    @property
    def n(self) -> int:
        """Number of responses."""
        return int(self.groups.shape[0])

