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
ALLOWED_KEYS = ("name", "authors", "track", "kind", "link", "description", "status", "reason",
                "requirements", "build_from_sdist", "cost", "frozen")
KINDS = ("estimator", "control")
#: ``status``: an entry runs (the default, omitted) or does not run on bt-bench's machines
RUNS, DOES_NOT_RUN = "runs", "does-not-run-here"
STATUSES = (RUNS, DOES_NOT_RUN)
#: the longest ``reason`` (one line: the exact error and the version tried)
MAX_REASON = 2000
#: ``cost`` keys (written by ``submit``): what the entry took on the machine it was submitted on
COST_KEYS = ("release", "score_rollouts_s", "env_build_s", "machine")
#: a duration in ``cost`` above this is not a measurement of one evaluation (a week, in s)
MAX_SECONDS = 7 * 86400
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
    status = meta.get("status", RUNS)
    if status not in STATUSES:
        raise SubmissionError(
            f"{where}: status {status!r} is not one of {', '.join(STATUSES)}; omit it for an "
            f"entry that runs, or set status: {DOES_NOT_RUN} with a reason."
        )
    reason = meta.get("reason")
    if status == DOES_NOT_RUN:
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip() \
                or len(reason.strip()) > MAX_REASON:
            raise SubmissionError(
                f"{where}: status {DOES_NOT_RUN} needs reason: one line of at most {MAX_REASON} "
                f"characters with the exact error and the version tried, got {reason!r}."
            )
        _plain_text(reason.strip(), f"{where}: reason", "one line of plain text")
        out["status"] = status
        out["reason"] = reason.strip()
    elif reason is not None:
        raise SubmissionError(
            f"{where}: reason is only for status: {DOES_NOT_RUN} (an entry that cannot run "
            "here); remove it, or set that status."
        )
    if meta.get("requirements") is not None:
        try:
            pins = parse_requirements(meta["requirements"], where)
        except RequirementError as exc:
            raise SubmissionError(str(exc)) from None
        if pins:
            out["requirements"] = pins
    if meta.get("build_from_sdist") is not None:
        from benchmark.sandbox.requirements import parse_sdists

        try:
            sdists = parse_sdists(meta["build_from_sdist"], out.get("requirements", []), where)
        except RequirementError as exc:
            raise SubmissionError(str(exc)) from None
        if sdists:
            out["build_from_sdist"] = sdists
    if meta.get("cost") is not None:
        out["cost"] = _cost(meta["cost"], where)
    if meta.get("frozen") is not None:
        out["frozen"] = _frozen(meta["frozen"], where)
    return out


def _cost(value: object, where: str) -> dict[str, Any]:
    """``cost`` (written by ``submit``): what one evaluation of the entry took, and where.

    ``{release: <id>, score_rollouts_s: <s>, env_build_s: <s or null>, machine: <text>}``:
    ``score_rollouts_s`` is the wall time of the scoring sandbox over every seed, task and view of
    the release (its determinism re-run not included), ``env_build_s`` the time its environment
    took to build (install, checks, smoke test; null without requirements or when unknown).
    """
    form = ("cost must be {release: <release id>, score_rollouts_s: <seconds>, env_build_s: "
            "<seconds or null>, machine: <one line>} as bt-bench submit writes it")
    if not isinstance(value, dict) or set(value) != set(COST_KEYS):
        got = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
        raise SubmissionError(f"{where}: {form}; got {got} (re-submit with bt-bench submit "
                              "--force, or remove the key).")
    out: dict[str, Any] = {}
    for key in ("release", "machine"):
        text = value[key]
        if not isinstance(text, str) or not text.strip() or len(text) > 200:
            raise SubmissionError(f"{where}: cost.{key} {text!r} must be one line of at most "
                                  f"200 characters; {form}.")
        _plain_text(text.strip(), f"{where}: cost.{key}", "one line of plain text")
        out[key] = text.strip()
    for key in ("score_rollouts_s", "env_build_s"):
        sec = value[key]
        if sec is None and key == "env_build_s":
            out[key] = None
            continue
        if isinstance(sec, bool) or not isinstance(sec, int | float) \
                or not 0 <= sec <= MAX_SECONDS:
            raise SubmissionError(f"{where}: cost.{key} {sec!r} is not a duration; expected "
                                  f"seconds from 0 to {MAX_SECONDS}; {form}.")
        out[key] = float(sec)
    return {k: out[k] for k in COST_KEYS}


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
    installation raised (cached in ``envs``, ``(pins, sdists) -> environment or error``, so each
    distinct set is installed once).
    """
    from benchmark.sandbox.requirements import ensure_env

    pins = tuple(sub.meta.get("requirements", ()))
    if not pins:
        return None
    sdists = tuple(sub.meta.get("build_from_sdist", ()))
    if (pins, sdists) not in envs:
        try:
            envs[(pins, sdists)] = ensure_env(pins, where=str(sub.path / METADATA_FILE),
                                              build_from_sdist=sdists)
        except RequirementError as exc:
            envs[(pins, sdists)] = exc
    return envs[(pins, sdists)]


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
    if declares_not_running(p):
        raise SubmissionError(
            f"{p}: declares status {DOES_NOT_RUN}: it has no results to load (the leaderboard "
            "lists it with its reason, verify checks its folder); to score it, remove status and "
            "reason and submit it with bt-bench submit."
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


def _folders(submissions_dir: str | Path) -> list[Path]:
    root = Path(submissions_dir)
    if not root.is_dir():
        raise SubmissionError(
            f"{root}: submissions folder not found; pass --submissions-dir pointing at the "
            "folder that holds submissions/<name>/ (default ./submissions)."
        )
    return sorted((d for d in root.iterdir()
                   if d.is_dir() and not d.name.startswith(("_", "."))), key=lambda d: d.name)


def declares_not_running(folder: str | Path) -> bool:
    """Whether ``folder/submission.yaml`` is valid and says ``status: does-not-run-here``.

    An unreadable or invalid file answers False, so :func:`load_submission` reports its error.
    """
    path = Path(folder) / METADATA_FILE
    try:
        meta = validate_metadata(read_metadata(path), str(path))
    except (BenchmarkError, OSError):
        return False
    return meta.get("status") == DOES_NOT_RUN


def find_submissions(submissions_dir: str | Path) -> list[Path]:
    """Submission folders under ``submissions_dir`` that run, sorted by name.

    ``_*`` and ``.*`` folders are skipped, and so are entries that declare ``status:
    does-not-run-here`` (:func:`find_not_running`): they have no results to score or rank.
    """
    return [d for d in _folders(submissions_dir) if not declares_not_running(d)]


def find_not_running(submissions_dir: str | Path) -> list[dict[str, Any]]:
    """The validated ``submission.yaml`` of every entry that declares it does not run here.

    Such a folder holds ``estimator.py`` (the glue that was tried) and ``submission.yaml`` with
    ``status: does-not-run-here``, the ``reason`` (the exact error) and the ``requirements``
    tried; it has no ``results.json`` (a folder that has one is refused: results of an entry
    that does not run cannot be trusted to mean anything).

    Raises:
        SubmissionError: the folder's name differs from its ``name``, or it holds results.
    """
    return [check_not_running(d) for d in _folders(submissions_dir) if declares_not_running(d)]


def check_not_running(folder: str | Path) -> dict[str, Any]:
    """The validated ``submission.yaml`` of a folder that declares it does not run here.

    Raises:
        SubmissionError: it does not declare that status, its name differs from the folder's,
            it lacks ``estimator.py`` or it holds ``results.json``.
    """
    d = Path(folder)
    meta = validate_metadata(read_metadata(d / METADATA_FILE), str(d / METADATA_FILE))
    if meta.get("status") != DOES_NOT_RUN:
        raise SubmissionError(f"{d / METADATA_FILE}: status is not {DOES_NOT_RUN}.")
    if meta["name"] != d.name:
        raise SubmissionError(
            f"{d / METADATA_FILE}: name {meta['name']!r} differs from the folder name "
            f"{d.name!r}; they must be equal (rename the folder or fix the name).")
    if (d / RESULTS_FILE).exists() or not (d / ESTIMATOR_FILE).is_file():
        raise SubmissionError(
            f"{d}: status {DOES_NOT_RUN} means {ESTIMATOR_FILE} (the glue that was tried) and "
            f"no {RESULTS_FILE}; remove {RESULTS_FILE}, or remove status and reason and submit "
            "the entry.")
    return meta



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

