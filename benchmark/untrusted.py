"""Showing text an estimator or a pull request wrote (messages, traceback, output, names) safely.

Such text can carry terminal escape sequences (rewriting what the user sees: a FAIL turned into
a PASS), control characters, bidirectional overrides, or be arbitrarily long. :func:`clean_text`
keeps printable characters only and caps the length; :func:`quote` labels the text as the
estimator's own and indents it so it cannot pass for a line of bt-bench.
:func:`unsafe_characters` finds the characters refused in text that reaches the leaderboard
(``submission.yaml``, ``results.json``), and :func:`visible` shows them as inert escapes.
"""

from __future__ import annotations

import re
import unicodedata

# CSI (ESC [ ... final), OSC/DCS/SOS/PM/APC strings (ESC ] ... BEL or ST), two-byte ESC
# sequences, and their 8-bit C1 forms
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"
    r"|\x1b[ -/]*[0-~]",
    re.DOTALL,
)


#: Unicode categories refused in text that reaches the leaderboard: control characters (Cc:
#: newline, tab, escape, ...), format characters (Cf: bidirectional overrides such as U+202E,
#: zero-width characters), surrogates (Cs), and line and paragraph separators (Zl, Zp)
UNSAFE_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def unsafe_characters(text: str) -> list[str]:
    """The characters of ``text`` in :data:`UNSAFE_CATEGORIES`, as ``"U+202E"`` (in order, once)."""
    found = dict.fromkeys(f"U+{ord(ch):04X}" for ch in text
                          if unicodedata.category(ch) in UNSAFE_CATEGORIES)
    return list(found)


def visible(text: str) -> str:
    r"""``text`` with each character of :data:`UNSAFE_CATEGORIES` shown as an escape (``\u202e``).

    For renderers of text they must show (a leaderboard cell): the character is neither
    interpreted (no new line, no reordering) nor hidden.
    """
    if not any(unicodedata.category(ch) in UNSAFE_CATEGORIES for ch in text):
        return text
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in UNSAFE_CATEGORIES
                   else ch for ch in text)


def _printable(ch: str, multiline: bool) -> str:
    if ch == "\n":
        return "\n" if multiline else " "
    if ch == "\t":
        return "    " if multiline else " "
    if ch.isprintable() or ch == " ":
        return ch
    cat = unicodedata.category(ch)
    return " " if cat in ("Zl", "Zp") else "?"


def clean_text(text: object, limit: int = 4000, multiline: bool = True,
               keep: str = "head") -> str:
    """``text`` with escape sequences removed, other non-printables replaced, length capped.

    Args:
        text: anything; non-strings go through ``str`` (a failing ``__str__`` is reported).
        limit: most characters kept (a note says how many were cut).
        multiline: keep newlines (tabs become spaces); otherwise one line.
        keep: ``"head"`` keeps the start, ``"tail"`` the end (for output tails).
    """
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception as exc:  # noqa: BLE001 - a hostile __str__
            text = f"<unprintable: {type(exc).__name__}>"
    if len(text) > 4 * limit + 4096:  # bound the work before the regular expression
        text = text[: 4 * limit + 4096] if keep == "head" else text[-(4 * limit + 4096):]
    text = _ESCAPES.sub("", text.replace("\r\n", "\n"))
    text = "".join(_printable(ch, multiline) for ch in text)
    if len(text) > limit:
        cut = len(text) - limit
        text = (text[:limit] + f" ... ({cut} more characters cut)" if keep == "head"
                else f"({cut} earlier characters cut) ... " + text[-limit:])
    return text


def quote(text: str, label: str, limit: int = 4000, keep: str = "head") -> str:
    """``text`` cleaned and indented under ``label`` (one line per line, prefixed ``  | ``)."""
    body = clean_text(text, limit, keep=keep).strip("\n")
    if not body.strip():
        return ""
    return f"\n  {label}:\n" + "\n".join("  | " + line for line in body.splitlines())
