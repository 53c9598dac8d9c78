"""Running an untrusted estimator in the sandbox, and trusting nothing it sends back but scores.

For every piece of estimator code (``inspect``: load it and read its declared capabilities and
config; ``score``: score every view and draw) the evaluator

1. copies the estimator file into a private folder (the sha256 recorded is that of the bytes
   that run), exports the label-free views into a *view folder* (:mod:`benchmark.sandbox.view_io`),
   and lists what the sandbox may read: the Python installation, the ``benchmark`` and
   ``estimators`` packages, the estimator file, the view folder, the release files the views
   read in place (sketches), the release's checkpoint and tokenizer folders, and the paths the
   caller adds; it refuses when a label file or a git repository would be among them;
2. starts the sandbox (:mod:`benchmark.sandbox.layers`: bubblewrap, seccomp, an unprivileged uid,
   Landlock inside; limits on the whole process tree from :mod:`benchmark.sandbox.cgroups`) through
   the
   launcher :mod:`benchmark.sandbox._launch`, with stdin from ``/dev/null`` and the estimator's
   stdout/stderr on a pipe that is drained, capped and kept only as a tail;
3. when the sandboxed process says it is ready (before any estimator code ran), checks it from
   outside in ``/proc`` (namespaces, seccomp, no_new_privs, no capabilities, its uid) and
   records the protections itself; only then lets it load the estimator;
4. reads the result channel (:mod:`benchmark.sandbox.channel`): the declared metadata, validated
   (JSON scalars, bounded, printable), and one score array per expected call, each checked
   (header before allocation, numeric dtype, exact shape, finite);
5. holds one wall-clock deadline over all of it (both sandboxes of a ``score``), kills the whole
   process tree at the end of every run, and removes every temporary folder on every exit path,
   signals included.

The same sandbox runs a submission environment's smoke test (:func:`smoke_isolated`): the
environment's interpreter imports the core and every requirement there, never in the evaluator.

Determinism is checked from outside: a second, fresh sandbox re-scores the first seed's rollout
and step views (and its first draw when the estimator scores draws) and the arrays must match
byte for byte. A crash, a timeout, a limit, a refused access or a malformed result ends in an
:class:`IsolationError` (or an ``EstimatorContractError``) naming the estimator and what
happened; text from the estimator is shown cleaned and labelled as its own.

This module holds the pipelines; their steps live by role: :mod:`.limits` (:class:`Limits`,
:class:`IsolationError`, the constants), :mod:`.launch` (step 1 and the command of step 2),
:mod:`.watch` (the child from its start to its end: steps 2 to 5), :mod:`.outcome` (what one run
left) and :mod:`.validate` (the metadata of step 4, the error a failed run deserves, the smoke
test's report and the determinism check).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from benchmark.errors import BenchmarkError
from benchmark.sandbox.launch import _platform, _Workspace
from benchmark.sandbox.limits import INSIDE_VIEW, IsolationError, Limits
from benchmark.sandbox.outcome import _Outcome
from benchmark.sandbox.validate import _deterministic, _raise_for, _smoke_report, validate_meta

# the view folder and the list of scoring calls, shared with the sandboxed side
from benchmark.sandbox.view_io import Views, assemble, export_views, load_views, score_calls
from benchmark.sandbox.watch import _outcome, _signals_end_cleanly

__all__ = ["INSIDE_VIEW", "IsolationError", "Limits", "Views", "assemble", "build_isolated",
           "export_views",
           "inspect_isolated", "load_views", "score_calls", "score_isolated", "smoke_isolated",
           "validate_meta"]


def _run(ws: _Workspace, mode: str, subset: bool, deadline: float) -> _Outcome:
    """One sandboxed run that ended well, or the error it deserves (naming the user's file)."""
    out = _outcome(ws, mode, subset, deadline)
    try:
        _raise_for(out, ws.name, ws.limits)
    except BenchmarkError as exc:
        if ws.full or ws.estimator_inside == str(ws.estimator):
            raise
        # without bubblewrap the estimator ran from its private copy: name the user's file
        raise type(exc)(str(exc).replace(ws.estimator_inside, str(ws.estimator))) from None
    return out


# ----------------------------------------------------------------------------------------------
# public API


def inspect_isolated(estimator_file: Path, limits: Limits | None = None, *,
                     python: str | None = None,
                     extra_read_only: Iterable[str | Path] = ()) -> dict:
    """Load the estimator file in the sandbox and return its declared metadata, validated.

    Args:
        estimator_file: the estimator's ``.py`` file.
        limits: the sandbox's limits (one deadline for the whole inspection).
        python: the interpreter to run inside (default: this one); its installation is bound
            read-only, never run outside the sandbox.
        extra_read_only: more paths the sandbox may read (e.g. that interpreter's environment).

    Returns:
        ``{"name", "class", "track", "tasks", "config", "sha256"}``; the file's code never runs
        in the calling process; ``sha256`` is that of the bytes that ran.
    """
    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    with _signals_end_cleanly(), _Workspace(Path(estimator_file), None, [], limits, python,
                                            extra_read_only, plat) as ws:
        out = _run(ws, "inspect", False, deadline)
        if out.meta is None:  # pragma: no cover - _raise_for covers every way to get here
            raise IsolationError(f"estimator {ws.name}: no metadata came back.")
        return out.meta | {"sha256": ws.sha256}


def smoke_isolated(spec: dict, limits: Limits | None = None, *, python: str | None = None,
                   extra_read_only: Iterable[str | Path] = ()) -> dict:
    """Run a submission environment's smoke test in the estimator sandbox; return its report.

    Args:
        spec: ``{"modules": {pin: [module, ...]}, "core_only": bool}``, what
            :func:`benchmark.sandbox.requirements.smoke_inside` checks.
        limits: the sandbox's limits (the wall time bounds the whole test).
        python, extra_read_only: the environment's interpreter and folders, as in
            :func:`inspect_isolated` (default: bt-bench's own interpreter).

    Returns:
        ``{"stage": "ok"}``; ``{"stage": "core", "step", "error"}``; ``{"stage": "import",
        "pin", "module", "error"}``; ``{"stage": "timeout", "error"}``; or ``{"stage":
        "crash", "how", "error"}`` (``error``: cleaned text, a traceback or the output's tail).

    Raises:
        IsolationError: the sandbox could not start or did not come up as specified.
    """
    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    name = "the requirements' smoke test"
    with _signals_end_cleanly(), _Workspace(None, None, [], limits, python, extra_read_only,
                                            plat, name=name) as ws:
        return _smoke_report(_outcome(ws, "smoke", False, deadline, spec), spec, name, limits)


def build_isolated(sdist: Path, limits: Limits | None = None) -> tuple[dict, bytes | None]:
    """Build the wheel of one sdist in the estimator sandbox; return the report and its bytes.

    The sandbox runs bt-bench's own interpreter (read-only) with the sdist's folder bound
    read-only and no network; ``pip wheel --no-deps --no-build-isolation --no-index`` writes into
    its private ``/tmp`` (:func:`benchmark.sandbox.sdist.build_inside`). Only the report and the
    wheel's bytes (one bounded ``uint8`` array) come back; check them with
    :func:`benchmark.sandbox.sdist.check_wheel` before using them.

    Args:
        sdist: the ``.tar.gz``, in a folder the sandbox's unprivileged uid can read.
        limits: the sandbox's limits (the wall time bounds the whole build).

    Returns:
        ``({"stage": "ok", "wheel": name, "size": n}, bytes)``; ``({"stage": "build", "error":
        cleaned text}, None)`` when pip failed; ``({"stage": "timeout" | "crash", "error"},
        None)`` when the sandbox ended otherwise.

    Raises:
        IsolationError: the sandbox could not start or did not come up as specified.
    """
    from benchmark.untrusted import clean_text

    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    sdist = Path(sdist).absolute()
    name = f"the build of {sdist.name}"
    with _signals_end_cleanly(), _Workspace(None, None, [], limits, None, [sdist.parent], plat,
                                            name=name) as ws:
        out = _outcome(ws, "build", False, deadline, {"sdist": str(sdist)})
    tail = clean_text(out.output.decode("utf-8", "replace"), 4000, keep="tail")
    r = out.smoke if isinstance(out.smoke, dict) else {}
    wheel = out.arrays.get("wheel")
    if out.done and r.get("stage") == "ok" and wheel is not None \
            and isinstance(r.get("wheel"), str) and len(wheel) == r.get("size"):
        return {"stage": "ok", "wheel": clean_text(r["wheel"], 300), "size": len(wheel)}, \
            wheel.tobytes()
    if out.done and r.get("stage") == "build":
        return {"stage": "build", "error": clean_text(str(r.get("error", "")), 8000,
                                                      keep="tail")}, None
    if out.timed_out:
        return {"stage": "timeout", "error": tail}, None
    how = out.channel_error or out.stopped or out.refused_sandbox or \
        f"the build ended without a wheel (exit {out.returncode})"
    if out.refused_sandbox:
        raise IsolationError(f"{name}: {out.refused_sandbox}")
    return {"stage": "crash", "error": f"{how}\n{tail}"}, None


def score_isolated(
    estimator_file: Path,
    views: Views,
    forbidden: list[Path],
    limits: Limits | None = None,
    *,
    python: str | None = None,
    extra_read_only: Iterable[str | Path] = (),
    meta: dict | None = None,
) -> tuple[dict[int, dict], dict]:
    """Score an estimator in the sandbox; check its contract from outside.

    Args:
        estimator_file: the estimator's ``.py`` file.
        views: seed -> (rollout view, step view, draws), built by the evaluator.
        forbidden: label files the sandbox must not be able to read (checked before it starts).
        limits: the sandbox's limits (one deadline over both sandboxes).
        python, extra_read_only: as in :func:`inspect_isolated`.
        meta: the metadata :func:`inspect_isolated` returned; when given, the scoring run must
            declare the same (and run the same bytes).

    Returns:
        ``(scores, info)``: scores[seed] = ``{"rollout": (n,), "step": (n_steps,),
        "draws": {draw_id: (m,)}}`` float64 arrays (validated: shape, dtype, finite), and
        ``info`` with the contract checks and protections the evaluator established itself, the
        limits and ``seconds``: the wall time (s) of the scoring sandbox (``score``: start to
        last score, every view of every seed) and of the determinism re-run (``rerun``),
        measured here (machine-dependent: never part of results).

    Raises:
        IsolationError / EstimatorContractError: the sandbox failed; nothing was scored.
    """
    limits = limits or Limits()
    deadline = time.monotonic() + limits.wall_seconds
    plat = _platform()
    with _signals_end_cleanly(), _Workspace(Path(estimator_file), views, forbidden, limits,
                                            python, extra_read_only, plat) as ws:
        if meta is not None and meta.get("sha256") not in (None, ws.sha256):
            raise IsolationError(f"estimator {ws.name} changed while it was being evaluated; "
                                 "rerun when the file is stable.")
        t0 = time.monotonic()
        main = _run(ws, "score", False, deadline)
        t1 = time.monotonic()
        if meta is not None and any(main.meta[k] != meta[k] for k in main.meta):
            raise IsolationError(f"estimator {ws.name} declared other capabilities or config "
                                 "when scoring than when inspected; they must be constant.")
        again = _run(ws, "score", True, deadline)
        t2 = time.monotonic()
        checks = _deterministic(ws.name, views, main, again)
    return assemble(views, main.arrays), {"contract_checks": checks,
                                           "protections": main.protections,
                                           "limits": asdict(limits),
                                           "seconds": {"score": t1 - t0, "rerun": t2 - t1}}
