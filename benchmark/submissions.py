"""Submissions: ``bt-bench submit`` writes ``submissions/NAME/``, ``bt-bench verify`` re-scores it.

A submission is a folder ``submissions/<name>/`` holding

* ``estimator.py``: a byte-for-byte copy of the submitted estimator file;
* ``submission.yaml``: who submitted what (validated strictly by :func:`validate_metadata`);
* ``results.json``: what ``bt-bench evaluate`` computed for ``estimator.py`` on the release.

``verify`` re-evaluates ``estimator.py`` on the release recorded in ``results.json`` with the
standard evaluation settings and compares the new results with the committed ones: verdicts, ids,
counts and every other non-float value exactly; floats within :data:`FLOAT_TOLERANCE`. Folders whose
name starts with ``_`` (e.g. ``submissions/_reference``) are not submissions.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.checklist import with_live_item
from benchmark.errors import BenchmarkError, InputFileError
from benchmark.sandbox.requirements import RequirementError, parse_requirements
from benchmark.untrusted import unsafe_characters

__all__ = [
    "ALLOWED_KEYS",
    "FLOAT_TOLERANCE",
    "IGNORED_KEYS",
    "REQUIRED_KEYS",
    "Drift",
    "SubmissionError",
    "VerifyReport",
    "check_results_text",
    "compare_results",
    "find_submissions",
    "load_submission",
    "submit",
    "submit_command",
    "validate_metadata",
    "verify",
    "verify_command",
    "verify_submission",
]

ESTIMATOR_FILE = "estimator.py"
METADATA_FILE = "submission.yaml"
RESULTS_FILE = "results.json"

#: submission.yaml keys that must be present
REQUIRED_KEYS = ("name", "authors", "track")
#: every key submission.yaml may hold, in the order ``submit`` writes them
ALLOWED_KEYS = ("name", "authors", "track", "kind", "link", "description", "requirements")
KINDS = ("estimator", "control")
TRACKS = ("gradient", "open")
#: a submission name (matched in full: ``$`` would accept a final newline)
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
#: a link: http(s) and printable ASCII without spaces (matched in full)
URL_RE = re.compile(r"https?://[!-~]+")

#: Absolute tolerance for floats in ``verify``. The evaluation is deterministic (seeded controls
#: and bootstraps), but CPU BLAS libraries sum in a machine-dependent order, so a dot product can
#: differ in its last bits between machines; results are rounded to 10 digits before writing, so a
#: last-bit difference can flip the 10th digit. 1e-6 is far below any difference a metric reports
#: (precision steps are 1/|GT|, AUC steps 1/pairs) and far above rounding noise.
FLOAT_TOLERANCE = 1e-6
#: tolerance for numbers computed from training replays (the causal scores): replays run in
#: float64 and differ between CPUs by about 1e-12 (docs/causal.md measures it); the margin is the
#: checklist's own cross-machine tolerance, inside which a verdict is inconclusive anyway
CAUSAL_TOLERANCE = 0.01
#: top-level results keys that ``verify`` reports but does not fail on (machine-specific)
IGNORED_KEYS = ("packages",)
#: leaf keys reported but not failed on anywhere (machine-specific by definition)
IGNORED_LEAVES: tuple[str, ...] = ()
#: leaf keys never compared: explanations derived from verdicts and numbers that are compared
#: themselves (verify never compares strings that embed numbers)
DERIVED_TEXT = ("reason",)
#: drift lines shown per submission before the report is cut short
MAX_DRIFT_LINES = 40


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
    return out


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
    import yaml

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
    try:
        raw = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SubmissionError(f"{meta_path}: not valid YAML ({exc}).") from exc
    meta = validate_metadata(raw, str(meta_path))
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


# ----------------------------------------------------------------------------------------------
# submit


#: attack controls: submissions that probe the benchmark itself (e.g. the memorizer, which embeds
#: the public labels), generated by maintainers' scripts; not run beside every entry
ATTACK_CONTROLS_DIR = Path(__file__).resolve().parent.parent / "estimators" / "controls" / "attacks"


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


def submit(
    estimator_file: str | Path,
    name: str,
    authors: Iterable[str] | None,
    *,
    link: str | None = None,
    description: str | None = None,
    release: str | Path = "tiny",
    submissions_dir: str | Path = "submissions",
    force: bool = False,
    progress: bool = True,
    requirements: Iterable[str] | None = None,
    time_limit: float | None = None,
    live: bool = True,
    live_draw: int | None = None,
    live_scale: str | None = None,
) -> Path:
    """Evaluate an estimator file and write ``<submissions_dir>/<name>/``.

    The folder is assembled in a temporary folder beside the target and renamed into place, so a
    failure (contract violation, bad metadata, interrupted run) leaves no partial submission.
    ``kind`` is ``control`` when the file is byte-identical to one of the evaluator's controls.

    Args:
        estimator_file: the ``.py`` file with one estimator class.
        name: submission name (``[a-z0-9][a-z0-9-]*``).
        authors: author names (at least one).
        link: optional URL of a paper or code.
        description: optional one-line description.
        release: release id or folder to score on.
        submissions_dir: the folder holding submissions.
        force: replace an existing submission of that name.
        progress: show progress bars.
        requirements: exact pins ``name==version`` the estimator needs (installed into its own
            environment, :mod:`benchmark.sandbox.requirements`); None reads them from an existing
            ``<submissions_dir>/<name>/submission.yaml`` (none when there is no such file).
        time_limit: wall-time limit of the estimator's sandbox in seconds (default 600).
        live: also score the entry on a live draw (:mod:`benchmark.live`) and record it under
            ``results["live"]``; False only in tests.
        live_draw: the live draw's id (default: chosen at random now, ``secrets``).
        live_scale: its run scale (default :data:`benchmark.live.LIVE_SCALE`).

    Returns:
        The submission folder.

    Raises:
        SubmissionError: invalid metadata, or the submission exists and ``force`` is false.
        RequirementError: a requirement is malformed, cannot be installed or breaks the core.
        EstimatorContractError: the estimator breaks the contract.
    """
    from benchmark.evaluate import evaluate, write_results
    from benchmark.sandbox.isolation import Limits, inspect_isolated
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.sandbox.requirements import ensure_env

    src = Path(estimator_file)
    require_sandbox("bt-bench submit")
    pins = _declared_requirements(Path(submissions_dir) / name, requirements)
    env = ensure_env(pins, where=f"submission {name!r} requirements")
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    kw = env.sandbox_kwargs() if env is not None else {}
    declared = inspect_isolated(src, limits, **kw)  # sandboxed; contract errors before any work
    track = declared["track"]
    meta: dict[str, Any] = {"name": name, "authors": list(authors or []), "track": track,
                            "kind": "estimator"}
    if link is not None:
        meta["link"] = link
    if description is not None:
        meta["description"] = description
    if not meta["authors"]:
        raise SubmissionError(
            "no authors given; pass --authors NAME [NAME ...] (at least one author)."
        )
    if pins:
        meta["requirements"] = pins
    meta = validate_metadata(meta, f"submission {name!r}")
    meta["kind"] = _control_kind(src, declared["name"])
    root = Path(submissions_dir)
    target = root / name
    if target.exists() and not force:
        raise SubmissionError(
            f"{target}: a submission named {name!r} already exists; choose another --name or "
            "pass --force to replace it."
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        shutil.copyfile(src, tmp / ESTIMATOR_FILE)
        results = evaluate(tmp / ESTIMATOR_FILE, release, progress=progress, isolation=limits,
                           env=env)
        if live:
            results["live"] = _score_live(tmp / ESTIMATOR_FILE, live_draw, live_scale,
                                          progress, limits, env)
            results = with_live_item(results)  # checklist item 11; the verdict counts it
        write_results(results, tmp / RESULTS_FILE)
        (tmp / METADATA_FILE).write_text(_dump_metadata(meta), encoding="utf-8")
        os.chmod(tmp, 0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=root))
            os.replace(target, old / name)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _score_live(estimator_file: Path, draw_id: int | None, scale: str | None, progress: bool,
                limits, env) -> dict:
    """``results["live"]`` of a submission: its scores on one live draw (random unless given)."""
    from benchmark import live

    scale = scale or live.LIVE_SCALE
    draw = live.check_draw_id(draw_id) if draw_id is not None else live.new_draw_id()
    print(f"live draw {draw} ({scale}{', chosen at random' if draw_id is None else ''}): "
          f"building or finding it, then scoring the entry on it", flush=True)
    rec = live.score_live(estimator_file, draw, scale, progress, isolation=limits, env=env)
    return live.live_block(scale, [rec])


def _declared_requirements(folder: Path, given: Iterable[str] | None) -> list[str]:
    """``given`` pins, else those of ``folder/submission.yaml`` when it exists; validated."""
    if given is not None:
        return parse_requirements(list(given), "--requirements")
    meta_path = folder / METADATA_FILE
    if not meta_path.is_file():
        return []
    import yaml

    try:
        raw = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SubmissionError(f"{meta_path}: not valid YAML ({exc}).") from exc
    value = raw.get("requirements") if isinstance(raw, dict) else None
    return parse_requirements(value, str(meta_path))


def submit_command(args: Any) -> int:
    """``bt-bench submit``: evaluate, write the submission folder, print the summary; exit 0."""
    from benchmark.evaluate import format_summary
    from benchmark.io import read_json

    target = submit(
        args.estimator, args.name, args.authors, link=args.link, description=args.description,
        release=args.release, submissions_dir=args.submissions_dir, force=args.force,
        progress=not args.no_progress, requirements=args.requirements,
        time_limit=args.time_limit, live=not args.no_live, live_draw=args.live_draw,
        live_scale=args.live_scale,
    )
    results = read_json(target / RESULTS_FILE)
    print(format_summary(results))
    if "live" in results:
        from benchmark.live import format_live

        print(format_live(results))
    print(f"\nwrote {target}/ ({ESTIMATOR_FILE}, {METADATA_FILE}, {RESULTS_FILE})")
    print("next: bt-bench leaderboard, then commit the submission and leaderboard/ in one PR "
          "(see CONTRIBUTING.md)")
    return 0


# ----------------------------------------------------------------------------------------------
# verify


@dataclass(frozen=True)
class Drift:
    """One value that differs between the committed and the recomputed results."""

    path: str
    committed: object
    recomputed: object

    def __str__(self) -> str:
        return (f"{self.path}: committed {_show(self.committed)}, "
                f"recomputed {_show(self.recomputed)}")


_ABSENT = object()


def _show(v: object) -> str:
    if v is _ABSENT:
        return "(absent)"
    if isinstance(v, dict | list):
        text = repr(v)
        return text if len(text) <= 60 else text[:57] + "..."
    return repr(v) if isinstance(v, str) else str(v)


def compare_results(committed: object, recomputed: object, tol: float = FLOAT_TOLERANCE,
                    _path: str = "") -> list[Drift]:
    """Every difference between two results trees, as dotted paths (list items by index).

    Floats (on either side, when the other is a number) match within ``tol``; everything else,
    including ints, strings, booleans and ``None``, must be equal. Missing keys are drifts.
    """
    out: list[Drift] = []
    from benchmark.causal.score import is_encoded_array

    if is_encoded_array(committed) or is_encoded_array(recomputed):
        return _compare_arrays(committed, recomputed, tol, _path)
    if isinstance(committed, dict) and isinstance(recomputed, dict):
        for k in sorted(set(committed) | set(recomputed), key=str):
            if k in DERIVED_TEXT:
                continue
            sub = f"{_path}.{k}" if _path else str(k)
            if k not in committed:
                out.append(Drift(sub, _ABSENT, recomputed[k]))
            elif k not in recomputed:
                out.append(Drift(sub, committed[k], _ABSENT))
            else:
                out += compare_results(committed[k], recomputed[k], tol, sub)
        return out
    if isinstance(committed, list) and isinstance(recomputed, list):
        if len(committed) != len(recomputed):
            return [Drift(f"{_path} (length)", len(committed), len(recomputed))]
        for i, (a, b) in enumerate(zip(committed, recomputed, strict=True)):
            label = _item_label(a, b, i)
            out += compare_results(a, b, tol, f"{_path}.{label}" if _path else label)
        return out
    numbers = (int, float)
    if (isinstance(committed, float) or isinstance(recomputed, float)) and \
            isinstance(committed, numbers) and isinstance(recomputed, numbers) and \
            not isinstance(committed, bool) and not isinstance(recomputed, bool):
        if _is_causal(_path):
            tol = max(tol, CAUSAL_TOLERANCE)
        if not math.isclose(committed, recomputed, rel_tol=0.0, abs_tol=tol):
            out.append(Drift(_path, committed, recomputed))
        return out
    if type(committed) is not type(recomputed) or committed != recomputed:
        out.append(Drift(_path, committed, recomputed))
    return out


#: drifts reported per encoded array before the rest are counted
MAX_ARRAY_DRIFTS = 3


def _compare_arrays(committed: object, recomputed: object, tol: float, path: str) -> list[Drift]:
    """Compare two encoded arrays (``benchmark.causal.score.encode_array``) by their numbers.

    Each value is compared as a float (within ``CAUSAL_TOLERANCE`` under a causal path), never
    the encoded string; a drift names the value's index, ``path[i, j, k]``.
    """
    from benchmark.causal.score import CausalDataError, decode_array

    try:
        a, b = decode_array(committed), decode_array(recomputed)
    except CausalDataError as exc:
        return [Drift(path, committed, f"(not a readable encoded array: {exc})")]
    if a.shape != b.shape:
        return [Drift(f"{path} (shape)", list(a.shape), list(b.shape))]
    if _is_causal(path):
        tol = max(tol, CAUSAL_TOLERANCE)
    bad = np.argwhere(~np.isclose(a, b, rtol=0.0, atol=tol))
    out = [Drift(f"{path}[{', '.join(str(int(i)) for i in idx)}]", float(a[tuple(idx)]),
                 float(b[tuple(idx)])) for idx in bad[:MAX_ARRAY_DRIFTS]]
    if len(bad) > MAX_ARRAY_DRIFTS:
        out.append(Drift(f"{path} (values differing)", f"{len(bad)} of {a.size}",
                         f"beyond the first {MAX_ARRAY_DRIFTS}"))
    return out


def _is_causal(path: str) -> bool:
    """Whether a results path holds a number computed from training replays."""
    return any(p in ("causal", "causal_score", "random_band", "vs_random")
               for p in path.split("."))


def _item_label(a: object, b: object, i: int) -> str:
    """List items are named by index, or by their ``key`` (checklist items) when both agree."""
    if isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("key"), str) \
            and a.get("key") == b.get("key"):
        return a["key"]
    return str(i)


#: order of top-level keys in a drift report: what a reader needs first
_REPORT_ORDER = ("verdict", "estimator", "release", "settings", "summary", "seeds", "checklist")


def _report_order(d: Drift) -> tuple[int, str]:
    top = d.path.split(".", 1)[0].split(" ", 1)[0]
    rank = _REPORT_ORDER.index(top) if top in _REPORT_ORDER else len(_REPORT_ORDER)
    return rank, d.path


@dataclass
class VerifyReport:
    """The outcome of verifying one submission."""

    path: Path
    drifts: list[Drift] = field(default_factory=list)
    code_changed: bool = False
    ignored: list[Drift] = field(default_factory=list)
    error: str | None = None
    fix: str | None = None
    #: the live check (:func:`benchmark.live.live_gate`) on the run's new draw: ``{"draw_id",
    #: "scale", "ok", "reason", "reproduce"}``; None when it did not run
    live_check: dict | None = None

    @property
    def ok(self) -> bool:
        """True when nothing but the ignored keys differs and the live check did not fail."""
        return (not self.drifts and not self.code_changed and self.error is None
                and (self.live_check is None or bool(self.live_check["ok"])))

    def format(self) -> str:
        """A readable report: ``ok`` or the reasons it failed, one per line."""
        head = f"{self.path}: "
        if self.ok:
            lines = [head + "ok (results reproduced)"]
        else:
            n = len(self.drifts)
            lines = [head + "FAILED" + (f" ({n} value{'s' if n != 1 else ''} differ)" if n else "")]
        if self.error:
            lines.append(f"  {self.error}")
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        if self.code_changed:
            lines.append(
                f"  {self.path / ESTIMATOR_FILE}: the estimator code changed since results.json "
                "was written (sha256 differs from estimator.sha256 in results.json)")
        for d in self.drifts[:MAX_DRIFT_LINES]:
            lines.append(f"  {d}")
        if len(self.drifts) > MAX_DRIFT_LINES:
            lines.append(f"  ... and {len(self.drifts) - MAX_DRIFT_LINES} more")
        for d in self.ignored:
            lines.append(f"  note (not checked, machine-specific): {d}")
        lc = self.live_check
        if lc is not None:
            head = (f"live check on draw {lc['draw_id']} ({lc['scale']}): "
                    + ("ok" if lc["ok"] else "FAILED"))
            lines.append(f"  {head}: {lc['reason']}")
            if not lc["ok"]:
                lines.append(f"  reproduce: {lc['reproduce']}")
        return "\n".join(lines)


def verify_submission(path: str | Path, release: str | Path | None = None,
                      progress: bool = True, *, time_limit: float | None = None,
                      envs: dict | None = None, live_draw: int | None = None,
                      live_scale: str | None = None,
                      dump: str | Path | None = None) -> VerifyReport:
    """Re-score one submission and compare with its committed ``results.json``.

    The estimator is re-evaluated with the standard :class:`~benchmark.evaluate.EvalSettings`
    on ``release`` (default: the release id recorded in ``results.json``), so results produced
    with other settings show up as drift in ``settings.*``. Its declared ``requirements`` are
    installed first into their own environment (:func:`benchmark.sandbox.requirements.ensure_env`),
    whose interpreter runs the estimator.

    Live draws (:mod:`benchmark.live`): every draw recorded under ``results["live"]`` is rebuilt
    here (or found in the cache) and re-scored, and compared like the rest; where this machine
    trained another run from the draw's id (its ``run_sha256`` differs: another CPU or another
    torch/transformers), that draw's numbers cannot be reproduced here and are reported as a
    note, not a failure; item 11 and the overall verdict are then derived from the recorded
    draw and still compared (:func:`_with_live_item_here`). With
    ``live_draw``, the entry is also scored on that new draw and fails when its public suite
    score is significantly above the random band but its live one is not
    (:func:`benchmark.live.live_gate`, with :data:`benchmark.causal.score.CROSS_MACHINE_TOLERANCE`).

    Args:
        path: the submission folder.
        release: score on this release instead of the recorded one.
        progress: show progress bars.
        time_limit: wall-time limit of the estimator's sandbox in seconds (default 600).
        envs: a cache ``tuple(pins) -> environment or RequirementError`` shared by the
            submissions of one ``verify`` (each distinct set is installed once).
        live_draw: the live check's draw id (None: no live check).
        live_scale: its run scale (default :data:`benchmark.live.LIVE_SCALE`).
        dump: a folder to write the recomputed results to, as ``<folder name>.json`` (the
            committed file's encoding): two runs, e.g. before and after a refactor, can then
            be compared byte for byte (``diff -r``).

    Returns:
        The report; it is ``ok`` when every value matches (floats within
        :data:`FLOAT_TOLERANCE`) and the estimator file's sha256 equals the recorded one.
    """
    from benchmark.contract import file_sha256
    from benchmark.evaluate import evaluate, write_results
    from benchmark.io import read_json
    from benchmark.sandbox.isolation import Limits
    from benchmark.sandbox.layers import require_sandbox

    require_sandbox("bt-bench verify")
    sub = load_submission(path)
    report = VerifyReport(sub.path)
    committed = sub.results
    if file_sha256(sub.estimator_file) != committed.get("estimator", {}).get("sha256"):
        report.code_changed = True
    rel = release if release is not None else committed.get("release", {}).get("id")
    if not rel:
        report.error = (f"{sub.path / RESULTS_FILE}: no release.id recorded; pass --release or "
                        "regenerate with bt-bench submit --force")
        return report
    env = _submission_env(sub, envs if envs is not None else {}, report)
    if report.error:
        return report
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    try:
        fresh = evaluate(sub.estimator_file, rel, progress=progress, isolation=limits, env=env)
    except BenchmarkError as exc:
        report.error = f"re-evaluation failed: {exc}"
        report.fix = _failure_fix(sub, str(exc))
        return report
    other_runs: dict[int, tuple[str, str]] = {}
    if "live" in committed:
        fresh["live"] = _rescore_live(sub, committed["live"], progress, limits, env, report)
        if report.error:
            return report
        other_runs = _other_runs(committed["live"], fresh["live"])
        fresh = _with_live_item_here(fresh, committed["live"], other_runs)
    # compare after the same rounding and JSON encoding the committed file went through
    with tempfile.TemporaryDirectory(prefix="bt-bench-verify-") as tmp:
        write_results(fresh, Path(tmp) / RESULTS_FILE)
        recomputed = read_json(Path(tmp) / RESULTS_FILE)
    if dump is not None:
        Path(dump).mkdir(parents=True, exist_ok=True)
        write_results(fresh, Path(dump) / f"{sub.path.name}.json")
    for i, (was, now) in sorted(other_runs.items()):
        report.ignored.append(Drift(
            f"live.draws.{i}.run_sha256 (this machine trained another run from draw "
            f"{committed['live']['draws'][i].get('draw_id')}; its numbers are not compared, "
            "item 11 is derived from the recorded ones)",
            was, now))
    for d in sorted(compare_results(committed, recomputed), key=_report_order):
        top, leaf = d.path.split(".", 1)[0], d.path.rsplit(".", 1)[-1]
        parts = d.path.split(".")
        if top == "live" and len(parts) > 2 and parts[2] in {str(i) for i in other_runs}:
            continue  # another run: reported once above
        ignored = top in IGNORED_KEYS or leaf in IGNORED_LEAVES or (
            top == "live" and leaf == "manifest_sha256")  # names the build machine too
        (report.ignored if ignored else report.drifts).append(d)
    if live_draw is not None:
        _live_check(sub, fresh, live_draw, live_scale, progress, limits, env, report)
    return report


def _rescore_live(sub: Submission, recorded: object, progress: bool, limits, env,
                  report: VerifyReport) -> dict | None:
    """The submission's recorded live draws re-scored here (errors go to ``report``)."""
    from benchmark import live
    from benchmark.build.family import FAMILY_VERSION

    where = sub.path / RESULTS_FILE
    try:
        scale, draws = recorded["scale"], [int(d["draw_id"]) for d in recorded["draws"]]
        version = recorded["family_version"]
    except (TypeError, KeyError, ValueError):
        report.error = (f"{where}: live is not a live-draw record ({{'family_version', 'scale', "
                        "'draws': [{'draw_id', ...}]}})")
        report.fix = "regenerate it with bt-bench submit FILE --name NAME --force"
        return None
    if version != FAMILY_VERSION:
        report.error = (f"{where}: its live draws come from task family {version}; this bt-bench "
                        f"draws family {FAMILY_VERSION}, where the same ids are other runs")
        report.fix = ("re-score the submission: bt-bench submit FILE --name NAME --force (or "
                      "python scripts/rescore_submissions.py NAME)")
        return None
    out = []
    for d in draws:
        try:
            out.append(live.score_live(sub.estimator_file, d, scale, progress, isolation=limits,
                                       env=env))
        except BenchmarkError as exc:
            report.error = f"re-scoring live draw {d} ({scale}) failed: {exc}"
            report.fix = _failure_fix(sub, str(exc))
            return None
    return live.live_block(scale, out)


def _with_live_item_here(fresh: dict, recorded: dict, other: dict[int, tuple[str, str]]) -> dict:
    """``fresh`` with item 11 and the overall verdict, from the draws this machine can check.

    A recorded draw this machine trained as another run (``other``: :func:`_other_runs`) cannot
    be reproduced here, so item 11 and the verdict are derived from its *recorded* record in its
    place (the public numbers are this machine's): they are still compared, which checks that
    the committed item follows from the committed draws, while ``fresh["live"]["draws"]`` keeps
    what was computed here (reported as a note, not compared).
    """
    if not other:
        return with_live_item(fresh)
    draws = [recorded["draws"][i] if i in other else d
             for i, d in enumerate(fresh["live"]["draws"])]
    derived = with_live_item(dict(fresh) | {"live": dict(fresh["live"]) | {"draws": draws}})
    return dict(fresh) | {"live": dict(fresh["live"]) | {"item": derived["live"]["item"]},
                          "verdict": derived["verdict"]}


def _other_runs(committed: object, recomputed: object) -> dict[int, tuple[str, str]]:
    """Recorded live draws this machine rebuilt as another run: index -> (recorded, here)."""
    if not isinstance(committed, dict) or not isinstance(recomputed, dict):
        return {}
    out = {}
    for i, (a, b) in enumerate(zip(committed.get("draws", []), recomputed.get("draws", []),
                                   strict=False)):
        if isinstance(a, dict) and a.get("run_sha256") != b.get("run_sha256"):
            out[i] = (a.get("run_sha256"), b.get("run_sha256"))
    return out


def _is_attack_control(sub: Submission) -> bool:
    """True when ``sub`` is a control whose file is one of :data:`ATTACK_CONTROLS_DIR`'s."""
    return sub.meta.get("kind") == "control" and _is_attack_file(sub.estimator_file)


def _live_check(sub: Submission, fresh: dict, draw_id: int, scale: str | None, progress: bool,
                limits, env, report: VerifyReport) -> None:
    """Score ``sub`` on live draw ``draw_id`` and apply :func:`benchmark.live.live_gate`."""
    from benchmark import live
    from benchmark.causal.score import CROSS_MACHINE_TOLERANCE

    scale = scale or live.LIVE_SCALE
    cmd = f"bt-bench verify {sub.path} --live-draw {draw_id}" + (
        f" --live-scale {scale}" if scale != live.LIVE_SCALE else "")
    check = {"draw_id": int(draw_id), "scale": scale, "reproduce": cmd}
    est = fresh["estimator"]["name"]
    try:
        rec = live.score_live(sub.estimator_file, draw_id, scale, progress, isolation=limits,
                              env=env)
    except BenchmarkError as exc:
        report.live_check = check | {"ok": False,
                                     "reason": f"{est}: scoring on the live draw failed: {exc}"}
        return
    ok, reason = live.live_gate(fresh["suite"], rec["suite"], est, CROSS_MACHINE_TOLERANCE)
    if _is_attack_control(sub):
        # an attack control (e.g. the memorizer) exists to be caught: verify fails it when the
        # live check lets it through, so the mechanism proves itself on every run
        report.live_check = check | {
            "ok": not ok, "expected": "fail",
            "reason": ("attack control, caught as expected: " + reason) if not ok else
                      ("attack control NOT caught (the live check should fail it): " + reason)}
        if ok and report.fix is None:
            report.fix = ("the live check no longer tells this answer key from a method: see "
                          "docs/evaluation.md (Live draws) before changing benchmark/live.py.")
        return
    if sub.meta.get("kind") == "control":
        # the evaluator's own controls are trusted reference methods, re-scored from
        # estimators/controls: their live numbers are shown, a weak one at the band's edge on
        # some draw is not a failed submission
        report.live_check = check | {"ok": True, "gated": False,
                                     "reason": "control, shown and not gated: " + reason}
        return
    report.live_check = check | {"ok": ok, "reason": reason}
    if not ok and report.fix is None:
        report.fix = ("the entry's public score does not carry over to a run it has not seen: "
                      "run the reproduce command, and make the estimator attribute from the run "
                      "it is given (public labels or references do not transfer).")


def _submission_env(sub: Submission, envs: dict, report: VerifyReport):
    """The installed environment of ``sub``'s requirements (None without); errors go to report."""
    from benchmark.sandbox.requirements import ensure_env

    pins = tuple(sub.meta.get("requirements", ()))
    if not pins:
        return None
    if pins not in envs:
        try:
            envs[pins] = ensure_env(pins, where=str(sub.path / METADATA_FILE))
        except RequirementError as exc:
            envs[pins] = exc
    env = envs[pins]
    if isinstance(env, RequirementError):
        report.error = f"requirements could not be installed: {env}"
        report.fix = (f"correct requirements: in {sub.path / METADATA_FILE} as the message says, "
                      "then re-run bt-bench verify.")
        return None
    return env


def _failure_fix(sub: Submission, message: str) -> str:
    """What to do when re-scoring ``sub`` raised ``message``."""
    missing = re.search(r"No module named '([^']+)'", message)
    if missing:
        top = missing.group(1).split(".")[0]
        declared = ", ".join(sub.meta.get("requirements", ())) or "none"
        return (f"the estimator imports {top!r}, which is not installed: declare it in "
                f"{sub.path / METADATA_FILE} under requirements: as exact pins name==version "
                f"of the package and of every package it needs that bt-bench does not provide "
                f"(declared now: {declared}), then re-run bt-bench verify.")
    return ("the estimator failed while being re-scored (error above): fix estimator.py or its "
            "requirements, then re-run bt-bench submit FILE --name NAME --force and commit the "
            "new results.json.")


def verify(paths: Iterable[str | Path] | None = None, submissions_dir: str | Path = "submissions",
           release: str | Path | None = None, progress: bool = True,
           time_limit: float | None = None, live_check: bool = True,
           live_draw: int | None = None, live_scale: str | None = None,
           dump: str | Path | None = None) -> list[VerifyReport]:
    """Verify the given submission folders, or every one under ``submissions_dir``.

    Each distinct set of declared requirements is installed once (and cached across runs); each
    distinct recorded live draw is built once (grouped before scoring; cached across runs).
    With ``live_check``, every entry is also scored on one new live draw: ``live_draw``, else
    ``$BT_BENCH_LIVE_DRAW``, else an id chosen now (:func:`benchmark.live.gate_draw_id`),
    printed before anything is scored so that a failure can be reproduced. ``dump``: write
    each entry's recomputed results there (:func:`verify_submission`).
    """
    from benchmark import live
    from benchmark.sandbox.layers import require_sandbox

    require_sandbox("bt-bench verify")  # before a live draw is built
    folders = [Path(p) for p in paths] if paths else find_submissions(submissions_dir)
    if not folders:
        raise SubmissionError(
            f"{submissions_dir}: no submissions found; create one with bt-bench submit FILE "
            "--name NAME --authors NAME."
        )
    loaded = [load_submission(f) for f in folders]  # refuse a malformed one before any build
    scale = live_scale or live.LIVE_SCALE
    gate = None
    if live_check:
        gate, source = live.gate_draw_id(live_draw)
        print(f"live check: every entry is also scored on live draw {gate} ({scale}; "
              f"{source}); reproduce with --live-draw {gate} or {live.LIVE_DRAW_ENV}={gate}",
              flush=True)
    for d_scale, d in _recorded_draws(loaded) + ([(scale, gate)] if gate is not None else []):
        try:  # each draw once, before any entry is scored on it
            live.live_release(d, d_scale, progress=progress)
        except BenchmarkError:
            pass  # reported by the entries that need it
    envs: dict = {}
    return [verify_submission(f, release, progress, time_limit=time_limit, envs=envs,
                              live_draw=gate, live_scale=scale, dump=dump)
            for f in folders]


def _recorded_draws(subs: list[Submission]) -> list[tuple[str, int]]:
    """The distinct ``(scale, draw_id)`` recorded by the submissions' live blocks, sorted."""
    from benchmark.build.family import FAMILY_VERSION

    out = set()
    for sub in subs:
        rec = sub.results.get("live")
        try:
            if rec and rec.get("family_version") == FAMILY_VERSION:
                out |= {(str(rec["scale"]), int(d["draw_id"])) for d in rec["draws"]}
        except (TypeError, KeyError, ValueError, AttributeError):
            continue  # verify_submission reports it
    return sorted(out)


def verify_command(args: Any) -> int:
    """``bt-bench verify``: print one report per submission; exit 1 if any failed, else 0."""
    reports = verify(args.paths, args.submissions_dir, args.release, not args.no_progress,
                     time_limit=args.time_limit, live_check=not args.no_live_check,
                     live_draw=args.live_draw, live_scale=args.live_scale,
                     dump=getattr(args, "dump", None))
    for r in reports:
        print(r.format())
    bad = [r for r in reports if not r.ok]
    print(f"\n{len(reports) - len(bad)} of {len(reports)} submission(s) reproduced"
          + (f"; failed: {', '.join(str(r.path) for r in bad)}" if bad else "."))
    if any(not r.fix for r in bad):
        print("fix: if the change is intended, re-run bt-bench submit FILE --name NAME --force and "
              "commit the new results.json; otherwise restore the committed estimator.py.")
    return 1 if bad else 0
