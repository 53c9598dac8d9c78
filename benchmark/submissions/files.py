"""Submission folders ``submissions/<name>/``, read and validated.

* ``estimator.py``: a byte-for-byte copy of the submitted estimator file;
* ``submission.yaml``: who submitted what and when it was frozen (validated strictly by
  :func:`validate_metadata`);
* ``results.json``: what ``bt-bench evaluate`` computed for ``estimator.py`` on the public release
  (the development score);
* ``panel.json``: its scores on the season panel's draws (:mod:`benchmark.submissions.panel`).

Folders whose name starts with ``_`` (``submissions/_reference``, ``submissions/_panel``) are not
submissions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.errors import BenchmarkError, InputFileError
from benchmark.results_schema import check_results_document
from benchmark.sandbox.requirements import RequirementError, parse_requirements
from benchmark.untrusted import unsafe_characters

ESTIMATOR_FILE = "estimator.py"
METADATA_FILE = "submission.yaml"
RESULTS_FILE = "results.json"


#: submission.yaml keys that must be present
REQUIRED_KEYS = ("name", "authors", "track")
#: every key submission.yaml may hold, in the order ``submit`` writes them
ALLOWED_KEYS = ("name", "authors", "track", "kind", "link", "description", "requirements",
                "frozen")
KINDS = ("estimator", "control")
TRACKS = ("gradient", "open")
#: a submission name (matched in full: ``$`` would accept a final newline)
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
#: a link: http(s) and printable ASCII without spaces (matched in full)
URL_RE = re.compile(r"https?://[!-~]+")


class SubmissionError(BenchmarkError):
    """A submission folder, its ``submission.yaml`` or a ``submit`` request is invalid."""


# ----------------------------------------------------------------------------------------------
# submission.yaml


def validate_metadata(meta: object, where: str = METADATA_FILE) -> dict[str, Any]:
    """Check a parsed ``submission.yaml`` and return it with defaults filled in.

    Args:
        meta: the parsed YAML document.
        where: how to name the file in error messages.

    Returns:
        A new dict with the keys of :data:`ALLOWED_KEYS` that are set (``kind`` defaults to
        ``"estimator"``), in that order; ``requirements`` (exact pins, validated by
        :func:`benchmark.sandbox.requirements.parse_requirements`) with normalized names, omitted
        when
        empty.

    Raises:
        SubmissionError: not a mapping, an unknown or missing key, or a value of the wrong form.
    """
    allowed = ", ".join(ALLOWED_KEYS)
    if not isinstance(meta, dict):
        raise SubmissionError(
            f"{where}: expected a YAML mapping with the keys {allowed}, got "
            f"{type(meta).__name__}; see CONTRIBUTING.md for an example."
        )
    unknown = sorted(str(k) for k in meta if k not in ALLOWED_KEYS)
    if unknown:
        raise SubmissionError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys are {allowed} "
            "(remove or rename the unknown ones)."
        )
    missing = [k for k in REQUIRED_KEYS if k not in meta or meta[k] is None]
    if missing:
        raise SubmissionError(
            f"{where}: missing required key(s) {', '.join(missing)}; required keys are "
            f"{', '.join(REQUIRED_KEYS)} (allowed keys: {allowed})."
        )
    name = meta["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise SubmissionError(
            f"{where}: name {name!r} is not valid; expected lowercase letters, digits and '-', "
            "starting with a letter or digit (e.g. 'my-estimator')."
        )
    authors = meta["authors"]
    if (not isinstance(authors, list) or not authors
            or not all(isinstance(a, str) and a.strip() for a in authors)):
        raise SubmissionError(
            f"{where}: authors {authors!r} must be a non-empty list of names, e.g. "
            "authors: [Ada Lovelace, Alan Turing]."
        )
    for a in authors:
        _plain_text(a.strip(), f"{where}: author", "a name")
    track = meta["track"]
    if track not in TRACKS:
        raise SubmissionError(
            f"{where}: track {track!r} is not one of {', '.join(TRACKS)}; it must equal the "
            "estimator class's `track` attribute."
        )
    kind = meta.get("kind", "estimator")
    if kind not in KINDS:
        raise SubmissionError(
            f"{where}: kind {kind!r} is not one of {', '.join(KINDS)} (omit it for an estimator)."
        )
    out: dict[str, Any] = {"name": name, "authors": [a.strip() for a in authors],
                           "track": track, "kind": kind}
    link = meta.get("link")
    if link is not None:
        if not isinstance(link, str) or not URL_RE.fullmatch(link):
            raise SubmissionError(
                f"{where}: link {link!r} is not a URL; expected http(s):// and printable ASCII "
                "without spaces (percent-encode other characters), or omit the key."
            )
        out["link"] = link
    desc = meta.get("description")
    if desc is not None:
        if not isinstance(desc, str) or "\n" in desc.strip() or not desc.strip():
            raise SubmissionError(
                f"{where}: description must be one non-empty line of text, got {desc!r}."
            )
        _plain_text(desc.strip(), f"{where}: description", "one line of plain text")
        out["description"] = desc.strip()
    if meta.get("requirements") is not None:
        try:
            pins = parse_requirements(meta["requirements"], where)
        except RequirementError as exc:
            raise SubmissionError(str(exc)) from None
        if pins:
            out["requirements"] = pins
    if meta.get("frozen") is not None:
        out["frozen"] = _frozen(meta["frozen"], where)
    return out


def _frozen(value: object, where: str) -> dict[str, str]:
    """``frozen: {sha256, utc}`` (written by ``submit``): the file's sha256 and when it froze."""
    if not isinstance(value, dict) or set(value) != {"sha256", "utc"}:
        raise SubmissionError(
            f"{where}: frozen must be {{sha256: <64 hex>, utc: YYYY-MM-DDTHH:MM:SSZ}} as bt-bench "
            "submit writes it; re-submit with bt-bench submit FILE --name NAME --force.")
    return {"sha256": check_sha256(value["sha256"], f"{where}: frozen.sha256"),
            "utc": check_utc(value["utc"], f"{where}: frozen.utc")}


_HEX64 = frozenset("0123456789abcdef")


def check_utc(text: object, where: str, error: type[BenchmarkError] = SubmissionError) -> str:
    """``text`` when it is a UTC time ``YYYY-MM-DDTHH:MM:SSZ`` (as bt-bench writes it).

    Raises:
        ``error``: naming ``where``, the value and the expected form.
    """
    from datetime import datetime

    if isinstance(text, str) and len(text) == 20 and text.endswith("Z"):
        try:
            datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
            return text
        except ValueError:
            pass
    raise error(f"{where}: {str(text)[:40]!r} is not a UTC time; expected YYYY-MM-DDTHH:MM:SSZ "
                "(written by bt-bench submit / panel new)")


def check_sha256(text: object, where: str, error: type[BenchmarkError] = SubmissionError) -> str:
    """``text`` when it is a sha256 in lowercase hex.

    Raises:
        ``error``: naming ``where``, the value and the expected form.
    """
    if not isinstance(text, str) or len(text) != 64 or not set(text) <= _HEX64:
        raise error(f"{where}: {str(text)[:80]!r} is not a sha256; expected 64 lowercase hex "
                    "digits")
    return text


def submission_env(sub: Submission, envs: dict):
    """The installed environment of ``sub``'s requirements.

    None without requirements, else the environment, or the :class:`RequirementError` its
    installation raised (cached in ``envs``, ``tuple(pins) -> environment or error``, so each
    distinct set is installed once).
    """
    from benchmark.sandbox.requirements import ensure_env

    pins = tuple(sub.meta.get("requirements", ()))
    if not pins:
        return None
    if pins not in envs:
        try:
            envs[pins] = ensure_env(pins, where=str(sub.path / METADATA_FILE))
        except RequirementError as exc:
            envs[pins] = exc
    return envs[pins]


def _plain_text(text: str, what: str, expected: str,
                fix: str = "remove them (bidirectional overrides, zero-width and line-separator "
                           "characters are refused too)") -> None:
    """Refuse control, format and line-separator characters (they reach the leaderboard)."""
    bad = unsafe_characters(text)
    if bad:
        shown = repr(text) if len(text) <= 120 else repr(text[:117]) + "..."
        raise SubmissionError(
            f"{what} {shown} contains control or format characters ({', '.join(bad[:5])}); "
            f"expected {expected}: {fix}."
        )


_REGENERATE = ("bt-bench never writes them, so the file was edited: regenerate it with bt-bench "
               "submit FILE --name NAME --force")


def check_results_text(results: object, where: str, _path: str = "") -> None:
    """Refuse a string (value or key) of a results tree with control or format characters.

    bt-bench writes none (estimator names and config strings are printable); such a string in a
    committed ``results.json`` was edited in, and would reach the leaderboard.

    Raises:
        SubmissionError: naming the first such string by its dotted path.
    """
    if isinstance(results, dict):
        for k, v in results.items():
            sub = f"{_path}.{k}" if _path else str(k)
            if isinstance(k, str) and unsafe_characters(k):
                _plain_text(k, f"{where}: the key {sub!r}", "plain text", _REGENERATE)
            check_results_text(v, where, sub)
    elif isinstance(results, list):
        for i, v in enumerate(results):
            check_results_text(v, where, f"{_path}.{i}" if _path else str(i))
    elif isinstance(results, str) and unsafe_characters(results):
        _plain_text(results, f"{where}: {_path}", "plain text", _REGENERATE)


#: the largest submission.yaml read (bt-bench writes well under 2 KiB)
MAX_METADATA_BYTES = 64 * 1024
#: the deepest nesting of [ and { read in it (bt-bench writes none)
MAX_METADATA_DEPTH = 16


def read_metadata(path: Path) -> object:
    """Parse a ``submission.yaml`` after limits that no crafted file gets past.

    At most :data:`MAX_METADATA_BYTES`, UTF-8, flow nesting (``[``, ``{`` outside quotes) at
    most :data:`MAX_METADATA_DEPTH`; then ``yaml.safe_load`` (standard tags only; an alias is a
    shared reference, so an alias bomb does not expand, and :func:`validate_metadata` refuses
    anything but flat strings and lists of them), its ``RecursionError`` refused too.

    Raises:
        SubmissionError: naming the file, the limit and the fix.
    """
    import yaml

    fix = "write it as bt-bench submit does (plain keys and values), or regenerate it"
    data = path.read_bytes()
    if len(data) > MAX_METADATA_BYTES:
        raise SubmissionError(f"{path}: {len(data)} bytes, more than the {MAX_METADATA_BYTES} a "
                              f"submission.yaml may hold; {fix}.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SubmissionError(f"{path}: not UTF-8 text; {fix}.") from None
    depth = deepest = 0
    quote = ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    if deepest > MAX_METADATA_DEPTH:
        raise SubmissionError(f"{path}: nested {deepest} levels deep (at most "
                              f"{MAX_METADATA_DEPTH}); {fix}.")
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise SubmissionError(f"{path}: not valid YAML ({str(exc)[:200]}).") from None


def _dump_metadata(meta: dict[str, Any]) -> str:
    import yaml

    ordered = {k: meta[k] for k in ALLOWED_KEYS if k in meta}
    return yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True, default_flow_style=False,
                          width=1000)


@dataclass
class Submission:
    """A submission folder read from disk (metadata validated, results parsed)."""

    path: Path
    meta: dict[str, Any]
    results: dict[str, Any]

    @property
    def name(self) -> str:
        """The submission's name (= its folder name)."""
        return str(self.meta["name"])

    @property
    def estimator_file(self) -> Path:
        """The submitted estimator file."""
        return self.path / ESTIMATOR_FILE


def load_submission(path: str | Path) -> Submission:
    """Read and validate one submission folder.

    Raises:
        SubmissionError: a file is missing, ``submission.yaml`` is invalid, its name differs from
            the folder name, or its track differs from the one recorded in ``results.json``.
        InputFileError: ``results.json`` is not valid JSON.
    """
    from benchmark.io import read_json

    p = Path(path)
    if not p.is_dir():
        raise SubmissionError(
            f"{p}: submission folder not found; expected a folder submissions/<name>/ with "
            f"{ESTIMATOR_FILE}, {METADATA_FILE} and {RESULTS_FILE} (create it with bt-bench "
            "submit)."
        )
    missing = [f for f in (ESTIMATOR_FILE, METADATA_FILE, RESULTS_FILE) if not (p / f).is_file()]
    if missing:
        raise SubmissionError(
            f"{p}: missing {', '.join(missing)}; a submission holds {ESTIMATOR_FILE}, "
            f"{METADATA_FILE} and {RESULTS_FILE} (regenerate it with bt-bench submit --force)."
        )
    meta_path = p / METADATA_FILE
    meta = validate_metadata(read_metadata(meta_path), str(meta_path))
    if meta["name"] != p.name:
        raise SubmissionError(
            f"{meta_path}: name {meta['name']!r} differs from the folder name {p.name!r}; "
            "they must be equal (rename the folder or fix the name)."
        )
    results = read_json(p / RESULTS_FILE)
    if not isinstance(results, dict) or "estimator" not in results:
        raise InputFileError(
            f"{p / RESULTS_FILE}: not a bt-bench results file (no 'estimator' key); regenerate "
            "it with bt-bench submit --force."
        )
    check_results_text(results, str(p / RESULTS_FILE))
    check_results_document(results, str(p / RESULTS_FILE))  # before anything indexes into it
    recorded = results["estimator"].get("track")
    if recorded != meta["track"]:
        raise SubmissionError(
            f"{meta_path}: track {meta['track']!r} differs from the estimator's declared track "
            f"{recorded!r} recorded in {RESULTS_FILE}; set track: {recorded}."
        )
    return Submission(p, meta, results)


def find_submissions(submissions_dir: str | Path) -> list[Path]:
    """Submission folders under ``submissions_dir``, sorted by name (``_*`` folders skipped)."""
    root = Path(submissions_dir)
    if not root.is_dir():
        raise SubmissionError(
            f"{root}: submissions folder not found; pass --submissions-dir pointing at the "
            "folder that holds submissions/<name>/ (default ./submissions)."
        )
    return sorted((d for d in root.iterdir()
                   if d.is_dir() and not d.name.startswith(("_", "."))), key=lambda d: d.name)



#: attack controls: submissions that probe the benchmark itself (e.g. the memorizer, which embeds
#: the public labels), generated by maintainers' scripts; not run beside every entry
ATTACK_CONTROLS_DIR = (Path(__file__).resolve().parent.parent.parent / "estimators" / "controls"
                       / "attacks")


def _is_attack_file(estimator_file: Path) -> bool:
    """True when the file is byte-identical to one of :data:`ATTACK_CONTROLS_DIR`'s."""
    from benchmark.contract import file_sha256

    digest = file_sha256(estimator_file)
    return any(file_sha256(p) == digest for p in sorted(ATTACK_CONTROLS_DIR.glob("*.py")))


def _control_kind(estimator_file: Path, est_name: str) -> str:
    """``control`` for an evaluator's control file or an attack control, else ``estimator``.

    Attack controls are the files of :data:`ATTACK_CONTROLS_DIR`. An estimator may not take a
    control's name: the evaluator keys methods by name, so the control would shadow it.
    """
    from benchmark.contract import file_sha256
    from benchmark.controls import control_files

    if _is_attack_file(estimator_file):
        return "control"
    digest = file_sha256(estimator_file)
    for cname, path in control_files("open").items():
        if file_sha256(path) == digest:
            return "control"
        if cname == est_name:
            raise SubmissionError(
                f"{estimator_file}: the estimator's name {est_name!r} is the name of the "
                f"evaluator's {cname!r} control; rename the class's `name` attribute."
            )
    return "estimator"

