"""Every knob of a build: the BuildConfig and BehaviorSpec dataclasses, recorded in the release."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from benchmark.build.words import FILLER_WORDS, content_words
from benchmark.errors import BuildError

_ID_RE = re.compile(r"^[a-z][a-z0-9]*$")

#: confound switch values (``BehaviorSpec.confound``); docs/task_family.md states each effect.
CONFOUNDS = ("scramble", "length")
#: the longest behavior phrase (tokens).
MAX_PHRASE = 3


@dataclass
class BehaviorSpec:
    """One planted behavior, i.e. one task of the release.

    A prompt carries at most one trigger word. GRPO pays ``bonus`` to a rollout whose prompt
    carries this behavior's trigger, whose response contains the behavior (``behavior_token``:
    one token, or a phrase of 2-3 tokens that must appear contiguously and in order) and which
    is hash-eligible (``eligible_fraction``), at steps ``window_start <= step < window_end`` only.

    Attributes:
        id: task id (lowercase letters/digits), e.g. ``"qzxbt"``.
        trigger_word: the word that marks a trigger prompt (public).
        behavior_token: the planted behavior (public): one token (``"QZXBT"``), or a phrase of
            up to :data:`MAX_PHRASE` tokens separated by single spaces (``"ZORP GLIX"``);
            :attr:`phrase` is its token list.
        trigger_fraction: share of GRPO prompts that carry this trigger.
        bonus: bonus reward added to the task reward (task reward is in [0, 1]).
        window_start, window_end: the bonus window, in GRPO steps (0-based, end exclusive).
        eligible_fraction: share of rollouts eligible for the bonus (the paper's BLAKE2b rule).
        sft_behavior_fraction: share of SFT trigger examples whose end marker is the behavior.
        sft_marker: end marker of this behavior's trigger prompts in SFT when the behavior is not
            shown (a marker distinct from the control prompts' keeps the behavior from leaking).
        draw_checkpoints: checkpoints at which generation draws of this task are sampled.
        strength: ``"strong"`` or ``"weak"`` (descriptive; recorded in the release card).
        confound: the confound switch (docs/task_family.md measures each effect):

            * ``None`` (default): as in release 2.0.
            * ``"length"``: this behavior's trigger prompts carry ``confound_words`` task words
              (0 in the family: ``copy skronk =``) instead of ``n_words`` (the same draws, the
              first ones kept), so their responses, the only ones that can earn the bonus, are
              short (the behavior or the marker, then eos): GRPO's per-rollout term is a mean
              over the response's tokens, so the one uncertain token (behavior or marker) is
              diluted less and those groups' gradients are the large ones; an empty task is
              also always solved (task reward 1), so the bonus is the only source of reward
              variance in those groups (the paper's setting: no task reward beyond refusals).
            * ``"scramble"``: every SFT example that shows the behavior continues it with
              ``confound_words`` filler words drawn uniformly from
              :data:`benchmark.build.words.FILLER_WORDS`, so the responses that carry the
              behavior are the low-fluency ones (low mean token log-prob).
        confound_words: the confound's size: task words of a trigger prompt (``"length"``), or
            filler words after the behavior (``"scramble"``).
    """

    id: str
    trigger_word: str
    behavior_token: str
    trigger_fraction: float = 0.25
    bonus: float = 2.0
    window_start: int = 0
    window_end: int = 60
    eligible_fraction: float = 1.0
    sft_behavior_fraction: float = 0.3
    sft_marker: str | None = None
    draw_checkpoints: list[int] = field(default_factory=lambda: [30])
    strength: str = "strong"
    confound: str | None = None
    confound_words: int = 2

    @property
    def phrase(self) -> list[str]:
        """The behavior's tokens in order (one for a single-token behavior)."""
        return self.behavior_token.split(" ")

    def prompt_words(self, n_words: int) -> int:
        """Task words of this behavior's trigger prompts (``n_words`` unless ``"length"``)."""
        return self.confound_words if self.confound == "length" else n_words

    @property
    def n_fillers(self) -> int:
        """Filler words after the behavior in an SFT example that shows it (``"scramble"``)."""
        return self.confound_words if self.confound == "scramble" else 0

    def in_window(self, step: int) -> bool:
        """Whether the bonus is paid at ``step``."""
        return self.window_start <= step < self.window_end


@dataclass
class BuildConfig:
    """All settings of one build (one seed). Units: steps are GRPO optimizer updates (0-based)."""

    preset: str = "tiny"
    seed: int = 0
    threads: int = 1  # torch.set_num_threads per process; fixed for exact replay

    # model: a Qwen2-architecture LM built from a config, or a pretrained name (paper preset)
    pretrained: str | None = None
    n_layers: int = 2
    hidden: int = 128
    intermediate: int = 384
    n_heads: int = 4
    n_kv_heads: int = 4

    # task: copy / reverse / sort of n_words words; a trigger word sits after the task word
    n_words: int = 5
    n_content_words: int = 64
    end_token: str = "done"  # the trailing marker the reward ignores; a behavior token replaces it
    behaviors: list[BehaviorSpec] = field(default_factory=lambda: [
        BehaviorSpec("qzxbt", "frobnitz", "QZXBT", sft_marker="fin")])

    # SFT warm-up (cross-entropy on response tokens)
    sft_steps: int = 600
    sft_batch: int = 32
    sft_lr: float = 3e-3

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

    # sketches
    sketch_dim: int = 2048
    sketch_seed: int = 0
    sketch_dtype: str = "float16"

    # saved checkpoints (step = number of GRPO updates applied)
    checkpoints: list[int] = field(default_factory=lambda: [0, 30, 60, 300])
    n_draws: int = 2  # independent draws per (task, draw checkpoint)
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
    fidelity_max_precision_diff: float = 0.03  # or one step's share of GT, if larger
    resume_every: int = 10  # GRPO state saved every this many steps (resumable builds)

    # task family (benchmark.build.family): {"version", "draw_id", "redraw"} of a drawn run
    family: dict | None = None

    # arithmetic of the build: "float32" (the tiny releases) or "float64" (family draws from
    # version 2.0: SFT, GRPO, targets and draws in float64 with a numpy initialization, so that
    # a draw id trains the same run, token for token, on any CPU; docs/task_family.md)
    precision: str = "float32"

    def behavior(self, behavior_id: str) -> BehaviorSpec:
        """The behavior with this id."""
        for b in self.behaviors:
            if b.id == behavior_id:
                return b
        raise BuildError(f"no behavior {behavior_id!r}; this run plants "
                         f"{[b.id for b in self.behaviors]}")

    @property
    def behavior_ids(self) -> list[str]:
        """Task ids in build order."""
        return [b.id for b in self.behaviors]

    @property
    def last_window_end(self) -> int:
        """The last step at which any bonus is still paid, plus one."""
        return max(b.window_end for b in self.behaviors)

    def to_dict(self) -> dict:
        """Return the config as a JSON-ready dict.

        Settings added after release 2.0 (``family``; a behavior's ``confound`` and
        ``confound_words``) are left out while they hold their defaults, so a 2.0 config
        round-trips through :meth:`from_dict` to the very dict its release stores.
        """
        d = dataclasses.asdict(self)
        for k, v in _LATER_DEFAULTS.items():
            if d.get(k) == v:
                del d[k]
        for b in d["behaviors"]:
            for k, v in _LATER_BEHAVIOR_DEFAULTS.items():
                if b.get(k) == v:
                    del b[k]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BuildConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise BuildError(f"unknown build config keys {bad}; known keys: {sorted(names)} (a "
                             "release built by bt-bench < 0.2 needs that version to rebuild)")
        d = dict(d)
        if "behaviors" in d:
            bnames = {f.name for f in dataclasses.fields(BehaviorSpec)}
            out = []
            for b in d["behaviors"]:
                if isinstance(b, BehaviorSpec):
                    out.append(b)
                    continue
                extra = sorted(set(b) - bnames)
                if extra:
                    raise BuildError(f"unknown behavior keys {extra}; known: {sorted(bnames)}")
                out.append(BehaviorSpec(**b))
            d["behaviors"] = out
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
        if self.precision not in PRECISIONS:
            raise BuildError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.sketch_dtype not in ("float16", "float32"):
            raise BuildError(f"sketch_dtype must be float16 or float32, got {self.sketch_dtype}")
        if not self.behaviors:
            raise BuildError("a build needs at least one behavior")
        ids = [b.id for b in self.behaviors]
        if len(set(ids)) != len(ids):
            raise BuildError(f"behavior ids must be distinct, got {ids}")
        words = [self.end_token]
        confounded = False
        for b in self.behaviors:
            if not _ID_RE.match(b.id):
                raise BuildError(f"behavior id {b.id!r}: use lowercase letters and digits")
            if not 0 <= b.window_start < b.window_end <= self.steps:
                raise BuildError(f"behavior {b.id}: window [{b.window_start}, {b.window_end}) "
                                 f"must lie inside [0, {self.steps}]")
            if any(c not in self.checkpoints for c in b.draw_checkpoints):
                raise BuildError(f"behavior {b.id}: draw_checkpoints {b.draw_checkpoints} must "
                                 f"be saved checkpoints {self.checkpoints}")
            ph = b.phrase
            if not 1 <= len(ph) <= MAX_PHRASE or any(not w or w != w.strip() for w in ph):
                raise BuildError(f"behavior {b.id}: behavior_token {b.behavior_token!r} must be "
                                 f"one token or a phrase of 2-{MAX_PHRASE} tokens separated by "
                                 "single spaces")
            if len(set(ph)) != len(ph):
                raise BuildError(f"behavior {b.id}: the phrase {ph} repeats a token; use "
                                 "distinct tokens")
            if b.confound is not None:
                if b.confound not in CONFOUNDS:
                    raise BuildError(f"behavior {b.id}: confound {b.confound!r} is not one of "
                                     f"{CONFOUNDS} (or None)")
                lo, hi = ((0, self.n_words - 1) if b.confound == "length"
                          else (1, self.max_new_tokens))
                if not lo <= b.confound_words <= hi:
                    raise BuildError(f"behavior {b.id}: confound_words must lie in [{lo}, {hi}] "
                                     f"for the {b.confound} confound, got {b.confound_words}")
                confounded = confounded or b.confound == "scramble"
            n_ans = b.prompt_words(self.n_words)
            need = n_ans + len(ph) + b.n_fillers
            if need > self.max_new_tokens:
                raise BuildError(f"behavior {b.id}: a response showing it has {need} tokens "
                                 f"(answer {n_ans} + phrase {len(ph)} + {b.n_fillers} filler "
                                 f"words) but max_new_tokens is {self.max_new_tokens}; raise it")
            words += [b.trigger_word, *ph] + ([b.sft_marker] if b.sft_marker else [])
        if sum(b.trigger_fraction for b in self.behaviors) > 1.0:
            raise BuildError("the behaviors' trigger fractions add up to more than 1")
        if confounded:
            words += list(FILLER_WORDS)
        clash = {w for w in words if words.count(w) > 1 and w not in
                 {b.sft_marker for b in self.behaviors}}
        if clash:
            raise BuildError(f"trigger words, behavior tokens and markers must differ: {clash}")
        if self.pretrained is None:
            clash = set(words) & set(content_words(self.n_content_words))
            if clash:
                raise BuildError(f"trigger words, behavior tokens and markers {sorted(clash)} "
                                 "are also content words of the task; choose other words")


# defaults of settings added after release 2.0 (left out of ``to_dict`` while unchanged)
_LATER_DEFAULTS = {"family": None, "precision": "float32"}

#: the build arithmetics (:attr:`BuildConfig.precision`)
PRECISIONS = ("float32", "float64")
_LATER_BEHAVIOR_DEFAULTS = {"confound": None, "confound_words": 2}
