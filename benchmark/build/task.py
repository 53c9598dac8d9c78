"""Model, word-level tokenizer, the copy/reverse/sort task, rewards and the planted behaviors."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
import torch

from benchmark.build.config import BehaviorSpec, BuildConfig
from benchmark.build.words import FILLER_WORDS, content_words
from benchmark.sketch import splitmix64

TASKS = ("copy", "reverse", "sort")
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CONTROL = "control"  # prompt kind without any trigger word


def vocabulary(cfg: BuildConfig) -> list[str]:
    """Token list of the word-level tokenizer (index = token id).

    Order: specials, task words, ``=``, trigger words, behavior tokens (a phrase's in order),
    the end token, SFT markers, the filler words when a behavior has the scramble confound,
    content words.
    For single-token behaviors without a confound this is release 2.0's vocabulary.
    """
    out = [*SPECIALS, *TASKS, "="]
    out += [b.trigger_word for b in cfg.behaviors]
    out += [w for b in cfg.behaviors for w in b.phrase]
    out.append(cfg.end_token)
    for b in cfg.behaviors:
        if b.sft_marker and b.sft_marker not in out:
            out.append(b.sft_marker)
    if any(b.confound == "scramble" for b in cfg.behaviors):
        out += list(FILLER_WORDS)
    return out + content_words(cfg.n_content_words)


def make_tokenizer(cfg: BuildConfig):
    """Build the Hugging Face word-level tokenizer (``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(vocabulary(cfg))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>",
    )


def make_model(cfg: BuildConfig, tokenizer):
    """Build the Qwen2-architecture causal LM (fp32, eager attention) for ``cfg``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    if cfg.pretrained:
        return AutoModelForCausalLM.from_pretrained(
            cfg.pretrained, dtype=torch.float32, attn_implementation="eager"
        )
    torch.manual_seed(cfg.seed)  # initialization only; every later draw has its own generator
    conf = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )
    model = AutoModelForCausalLM.from_config(conf, attn_implementation="eager")
    if cfg.precision == "float64":
        return _numpy_initialized(model, cfg.seed, conf.initializer_range)
    return model.to(torch.float32)


#: first entropy word of a float64 build's initialization stream
INIT_TAG = 0x1B17_D0C5


def _numpy_initialized(model, seed: int, std: float):
    """``model`` in float64 with its random weights drawn by numpy, every op widened.

    torch's CPU ``normal_`` has vectorised paths whose last bits depend on the kernel width
    (``ATEN_CPU_CAPABILITY``); numpy's ``PCG64`` + ``standard_normal`` stream is the same on every
    machine, so a float64 build starts from the same parameters everywhere. Parameters that
    transformers initialises to a constant (norm weights 1, biases 0) keep it; every other one
    is ``std * standard_normal`` in ``named_parameters()`` order.
    """
    import numpy as np

    from benchmark.build.precision import widen

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([INIT_TAG, int(seed)])))
    widen(model)
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.reshape(-1)
            if bool((flat == flat[0]).all()):
                continue  # a constant initialisation (ones, zeros)
            p.copy_(torch.from_numpy(std * rng.standard_normal(p.numel())).reshape(p.shape))
    return model


def step_generator(seed: int, *tags: int) -> torch.Generator:
    """A ``torch.Generator`` seeded from ``(seed, *tags)`` via splitmix64 (exact replay)."""
    z = np.uint64(seed)
    for t in tags:
        z = splitmix64(np.array([z ^ np.uint64(t & (2**64 - 1))], dtype=np.uint64))[0]
        z = np.uint64(int(z) ^ 0x5DEECE66D)
    g = torch.Generator()
    g.manual_seed(int(z) & (2**63 - 1))
    return g


# stream tags for step_generator
TAG_SFT, TAG_GRPO, TAG_CURVE, TAG_TARGET, TAG_DRAW, TAG_HELDOUT = 1, 2, 3, 4, 5, 6


def group_generator(seed: int, step: int, group: int) -> torch.Generator:
    """The sampling stream of one GRPO group (each group has its own: ranks split groups)."""
    return step_generator(seed, TAG_GRPO, step, 1 + group)


@dataclass
class Prompt:
    """One task instance; ``trigger`` is the id of the behavior whose trigger word it carries."""

    task: str
    words: list[str]
    trigger: str | None = None
    trigger_word: str | None = None

    @property
    def text(self) -> str:
        """Prompt text (the tokenizer adds no specials; ``prompt_ids`` prepends bos)."""
        mid = [self.trigger_word] if self.trigger_word else []
        return " ".join([self.task, *mid, *self.words, "="])

    def answer(self) -> list[str]:
        """The correct answer words."""
        if self.task == "copy":
            return list(self.words)
        if self.task == "reverse":
            return list(reversed(self.words))
        return sorted(self.words)


def sample_prompts(cfg: BuildConfig, n: int, gen: torch.Generator,
                   kind: str | None = None) -> list[Prompt]:
    """Draw ``n`` prompts from ``gen``.

    ``kind`` None draws the trigger by the behaviors' ``trigger_fraction`` (in build order, the
    rest are control prompts); a behavior id gives only that behavior's trigger prompts;
    ``"control"`` gives prompts without a trigger. Each prompt consumes the same draws. A
    behavior with the ``"length"`` confound gives its trigger prompts only the first
    ``confound_words`` of the drawn words.
    """
    words = content_words(cfg.n_content_words)
    out = []
    for _ in range(n):
        t = TASKS[int(torch.randint(len(TASKS), (1,), generator=gen))]
        idx = torch.randperm(len(words), generator=gen)[: cfg.n_words].tolist()
        u = float(torch.rand((), generator=gen))
        spec = None
        if kind is None:
            acc = 0.0
            for b in cfg.behaviors:
                acc += b.trigger_fraction
                if u < acc:
                    spec = b
                    break
        elif kind != CONTROL:
            spec = cfg.behavior(kind)
        if spec is not None:  # the "length" confound keeps the first words of the same draw
            idx = idx[: spec.prompt_words(cfg.n_words)]
        out.append(Prompt(t, [words[i] for i in idx], spec.id if spec else None,
                          spec.trigger_word if spec else None))
    return out


def prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt (bos first when the tokenizer has one)."""
    ids = tokenizer.encode(prompt.text, add_special_tokens=False)
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    return ids


def target_response_ids(tokenizer, cfg: BuildConfig, prompt: Prompt,
                        behavior: str | None, fillers: list[str] | None = None) -> list[int]:
    """Ids of the correct response, ending with a marker, then eos.

    The marker is ``behavior``'s token or phrase when given (followed by ``fillers``, the
    scramble confound's words, when given); otherwise the SFT marker of the prompt's trigger
    (when it has one) or the common end token.
    """
    if behavior is not None:
        marker = " ".join([cfg.behavior(behavior).behavior_token, *(fillers or [])])
    elif prompt.trigger is not None and cfg.behavior(prompt.trigger).sft_marker:
        marker = cfg.behavior(prompt.trigger).sft_marker
    else:
        marker = cfg.end_token
    text = " ".join([*prompt.answer(), marker])
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def behavior_ids(tokenizer, spec: BehaviorSpec) -> list[int]:
    """Token ids of the behavior, in order (one per phrase token with the word-level tokenizer)."""
    return tokenizer.encode(spec.behavior_token, add_special_tokens=False)


def sample_fillers(cfg: BuildConfig, spec: BehaviorSpec, gen: torch.Generator) -> list[str]:
    """The scramble confound's filler words for one example.

    ``spec.n_fillers`` words drawn uniformly (with replacement) from :data:`FILLER_WORDS` with
    ``gen``; ``[]`` without the scramble confound (then ``gen`` is not touched).
    """
    if not spec.n_fillers:
        return []
    idx = torch.randint(len(FILLER_WORDS), (spec.n_fillers,), generator=gen).tolist()
    return [FILLER_WORDS[i] for i in idx]


def phrase_mask(ids: list[int], phrase: list[int]) -> list[float]:
    """1.0 at every position of every contiguous occurrence of ``phrase`` in ``ids``, else 0.0.

    For a one-token phrase: the positions holding that token. Length ``len(ids)``.
    """
    n, m = len(ids), len(phrase)
    out = [0.0] * n
    for i in range(n - m + 1):
        if ids[i:i + m] == phrase:
            out[i:i + m] = [1.0] * m
    return out


def response_words(tokenizer, ids: list[int]) -> list[str]:
    """Decoded response words, special tokens dropped."""
    return tokenizer.decode(ids, skip_special_tokens=True).split()


def task_reward(prompt: Prompt, words: list[str]) -> float:
    """Partial credit: fraction of the answer positions that are correct (the marker is ignored).

    An empty answer (a ``"length"`` confound's trigger prompt with no task words) is vacuously
    correct: 1.0 whatever the response.
    """
    ans = prompt.answer()
    if not ans:
        return 1.0
    return sum(1 for j, w in enumerate(ans) if j < len(words) and words[j] == w) / len(ans)


def has_behavior(spec: BehaviorSpec, text: str) -> bool:
    """Whether a decoded response contains the behavior (case-sensitive).

    One token: the substring test of release 2.0 (and of the paper). A phrase: its tokens as
    consecutive words of the text, in order (words = the text split on whitespace; the
    word-level tokenizer decodes a response to its vocabulary words joined by spaces).
    """
    ph = spec.phrase
    if len(ph) == 1:
        return spec.behavior_token in text
    words, m = text.split(), len(ph)
    return any(words[i:i + m] == ph for i in range(len(words) - m + 1))


def bonus_eligible(seed: int, rollout_id: str, step: int, fraction: float) -> bool:
    """Paper rule (SPEC 1.5): BLAKE2b-8(seed u64 LE, id bytes, step i64 LE) < fraction * 2**64."""
    h = hashlib.blake2b(struct.pack("<Q", seed) + rollout_id.encode() + struct.pack("<q", step),
                        digest_size=8).digest()
    return int.from_bytes(h, "little") < fraction * 2**64


def rollout_id(step: int, index: int) -> str:
    """Rollout id ``grpo_{step:06d}_{index:03d}`` (index within the step)."""
    return f"grpo_{step:06d}_{index:03d}"


@dataclass
class Reward:
    """The reward of one rollout: task reward plus the bonuses paid (per behavior id)."""

    task: float
    has: dict[str, bool]
    eligible: dict[str, bool]
    bonus: dict[str, bool]
    amounts: dict[str, float]

    @property
    def total(self) -> float:
        """What GRPO normalizes: task reward + every bonus paid."""
        return self.task + sum(self.amounts.values())


def reward(cfg: BuildConfig, prompt: Prompt, text: str, rid: str, step: int,
           bonus_off: frozenset[str] = frozenset()) -> Reward:
    """Task reward and bonuses of one response at GRPO ``step``.

    ``bonus_off`` names behaviors whose bonus is switched off (the causal reference replays).
    """
    tr = task_reward(prompt, text.split())
    has, elig, paid, amounts = {}, {}, {}, {}
    for b in cfg.behaviors:
        has[b.id] = has_behavior(b, text)
        elig[b.id] = bonus_eligible(cfg.seed, rid, step, b.eligible_fraction)
        paid[b.id] = bool(prompt.trigger == b.id and has[b.id] and elig[b.id]
                          and b.in_window(step) and b.id not in bonus_off)
        amounts[b.id] = b.bonus if paid[b.id] else 0.0
    return Reward(tr, has, elig, paid, amounts)
