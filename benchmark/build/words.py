"""The task's words: the content words and the scramble confound's filler words."""

from __future__ import annotations

import numpy as np

#: Filler words of the ``"scramble"`` confound (``BehaviorSpec.confound``): reserved nonsense
#: words used nowhere else (not content words, triggers, behaviors or markers). In a run with a
#: confounded behavior they are in the vocabulary, after the markers.
FILLER_WORDS = ("blorf", "cwimp", "drazzle", "fnoop", "glimber", "hrunk", "jaxle", "klorp",
                "mubble", "nizzle", "plonk", "quibber", "shmerp", "trundle", "vorpy", "wumbly")


def content_words(n: int) -> list[str]:
    """The task's content words: ``n`` consonant-vowel-consonant pseudo-words, sorted."""
    cons, vows = "bdfgklmnprstvz", "aeiou"
    words = [a + v + b for a in cons for v in vows for b in "nrst"]
    rng = np.random.default_rng(1234)
    return sorted(rng.choice(words, size=n, replace=False).tolist())
