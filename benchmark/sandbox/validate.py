"""Judging what came back from the sandbox: never trusted as sent, checked field by field.

The declared metadata (:func:`validate_meta`), an unsuccessful run turned into the error it
deserves (:func:`_raise_for`), the smoke test's report (:func:`_smoke_report`) and the
determinism check of two fresh sandboxes (:func:`_deterministic`). Text from the estimator is
shown cleaned and labelled as its own.
"""

from __future__ import annotations

from benchmark.sandbox import layers as sandbox
from benchmark.sandbox.limits import OUTPUT_STOP, OUTPUT_TAIL, SMOKE_STEPS, IsolationError, Limits
from benchmark.sandbox.outcome import _Outcome
from benchmark.sandbox.view_io import Views, score_calls
from benchmark.untrusted import clean_text, quote

# ----------------------------------------------------------------------------------------------
# validation of what the sandbox declares


def validate_meta(obj: object, who: str) -> dict:
    """The sandbox's declared metadata, checked field by field (never trusted as sent)."""
    from benchmark.contract import FALLBACK_VIEWS, MAX_NAME, TASKS, TRACKS, config_problem

    def bad(what: str) -> IsolationError:  # the caller names the estimator ({who})
        return IsolationError(f"its declared metadata was refused ({what}).")

    keys = {"name", "class", "track", "tasks", "fallbacks", "config", "has_score_draw"}
    if not isinstance(obj, dict) or set(obj) != keys:
        raise bad("not the expected fields")
    name, cls, track, tasks = obj["name"], obj["class"], obj["track"], obj["tasks"]
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME \
            or not name.isprintable() or name != name.strip():
        raise bad(f"name {clean_text(ascii(name), 80, multiline=False)} is not at most "
                  f"{MAX_NAME} printable characters")
    if not isinstance(cls, str) or not cls.isidentifier() or len(cls) > 100:
        raise bad(f"class {clean_text(ascii(cls), 80, multiline=False)} is not an identifier")
    if track not in TRACKS:
        raise bad(f"track {clean_text(ascii(track), 80, multiline=False)}")
    if not isinstance(tasks, list) or not tasks or len(set(map(str, tasks))) != len(tasks) \
            or any(t not in TASKS for t in tasks) or "rollouts" not in tasks:
        raise bad(f"tasks {clean_text(ascii(tasks), 80, multiline=False)}")
    if not isinstance(obj["has_score_draw"], bool) or ("draws" in tasks
                                                       and not obj["has_score_draw"]):
        raise bad("'draws' declared without score_draw")
    fb = obj["fallbacks"]
    if not isinstance(fb, list) or len(set(map(str, fb))) != len(fb) \
            or any(v not in FALLBACK_VIEWS for v in fb):
        raise bad(f"fallbacks {clean_text(ascii(fb), 80, multiline=False)}")
    problem = config_problem(obj["config"])
    if problem:
        raise bad(f"config: {problem}")
    return {k: obj[k] for k in ("name", "class", "track", "tasks", "fallbacks", "config")}


# ----------------------------------------------------------------------------------------------
# turning an outcome into scores or an error


def _gib(limits: Limits) -> str:
    return f"{limits.memory_bytes / 2**30:.1f} GiB"


def _output_tail(out: _Outcome) -> str:
    if not out.output_bytes:
        return ""
    text = out.output.decode("utf-8", "replace")
    return quote(text, f"its last output ({out.output_bytes} bytes in all; the estimator's own "
                       "text, cleaned)", OUTPUT_TAIL, keep="tail")


def _start_failure(out: _Outcome, name: str) -> str:
    """Why the sandbox never became ready, when bubblewrap or the launcher said so ("" else).

    Before *ready* only bt-bench's launcher, bubblewrap and the interpreter's start (without
    site-packages) have run, so their last line is shown as the reason.
    """
    if out.started or out.timed_out:
        return ""
    text = out.output.decode("utf-8", "replace")
    said = [ln for ln in text.splitlines()
            if ln.startswith(("bwrap: ", "bt-bench sandbox launcher: "))]
    if not said:
        return ""
    line = clean_text(said[-1], 500, multiline=False)
    hint = ("the sandbox's unprivileged user cannot read that path: make it and every folder "
            "above it readable by other users (chmod o+rx), or keep it (TMPDIR, the "
            "BT_BENCH_CACHE folder, the release) in a folder every user can traverse"
            if "Permission denied" in line
            else f"check the sandbox's setup: {sandbox.INSTALL_HINT}")
    return (f"the sandbox for {name} could not start ({line}); nothing ran in it. Fix: {hint}.")


def _raise_if_never_ran(out: _Outcome, name: str) -> None:
    """Raise when the sandbox was refused from outside or never started."""
    if out.refused_sandbox:
        raise IsolationError(out.refused_sandbox)
    start = _start_failure(out, name)
    if start:
        raise IsolationError(start)


def _raise_for(out: _Outcome, name: str, limits: Limits) -> None:
    """Raise the error an unsuccessful outcome deserves (nothing when it is complete)."""
    tail = _output_tail(out)
    _raise_if_never_ran(out, name)
    if out.exception is not None:
        raise type(out.exception)(f"estimator {name}: {out.exception}" + tail)
    _raise_if_stopped(out, name, limits, tail)
    if out.error is not None:
        _raise_estimator_error(out.error, name, limits, tail)
    if not out.done:
        rc = out.returncode
        how = ("was killed by a signal" if rc is None or rc < 0 or rc >= 128
               else f"exited with code {rc}")
        raise IsolationError(
            f"estimator {name}: its process {how} before returning its scores; an estimator "
            "must return scores, never exit the process." + tail)


def _raise_if_stopped(out: _Outcome, name: str, limits: Limits, tail: str) -> None:
    """Raise when the deadline, the channel or a limit ended the run."""
    if out.timed_out:
        raise IsolationError(
            f"estimator {name} exceeded the wall-time limit of {limits.wall_seconds:g} s and "
            "was stopped; make it faster or raise the limit (--time-limit SECONDS)." + tail)
    if out.channel_error:
        raise IsolationError(
            f"estimator {name} sent a result the evaluator refused ({out.channel_error}); only "
            "the declared metadata and score arrays of the expected shape are accepted." + tail)
    if out.stopped == "output":
        raise IsolationError(
            f"estimator {name} printed more than {OUTPUT_STOP >> 20} MiB and was stopped; "
            "print less." + tail)
    if out.oom or out.stopped == "memory":
        raise IsolationError(
            f"estimator {name}: ran out of memory under the limit of {_gib(limits)} for all its "
            "processes together and was stopped; use less memory or raise the limit "
            "(--memory-limit)." + tail)
    if out.stopped == "processes" or (out.pids_refused and not out.done):
        raise IsolationError(
            f"estimator {name} reached the limit of {limits.max_processes} processes and "
            "threads and was stopped; start fewer." + tail)


def _raise_estimator_error(error: dict, name: str, limits: Limits, tail: str) -> None:
    """Raise the error the sandboxed side reported (its message and traceback, cleaned)."""
    from benchmark.contract import EstimatorContractError

    kind = error.get("kind")
    text = clean_text(error.get("message", ""), 4000)
    tb = quote(error.get("traceback", ""), "the estimator's traceback")
    if kind == "memory":
        raise IsolationError(
            f"estimator {name}: ran out of memory under the limit of {_gib(limits)} ({text}); "
            "use less memory (stream the sketches in chunks) or raise the limit "
            "(--memory-limit)." + tb + tail)
    if kind == "refused":
        why = " (the sandbox refused it)" if "was denied access" in text else (
            "; the sandbox refused it (an estimator sees only its view, the Python "
            "installation and the release's checkpoints and tokenizer, writes only to /tmp, "
            "and has no network and no other process).")
        raise IsolationError(f"estimator {name}: {text}{why}" + tb + tail)
    cls = EstimatorContractError if kind == "contract" else IsolationError
    raise cls(f"estimator {name}: {text}" + tb + tail)


# ----------------------------------------------------------------------------------------------
# the smoke test's report


def _smoke_report(out: _Outcome, spec: dict, name: str, limits: Limits) -> dict:
    """The smoke test's report, checked field by field, or a timeout/crash naming what ended it.

    The report comes from the environment's own process, where its requirements ran: only its
    form is trusted (a stage, a known step, a pin and module that were asked for), its text is
    cleaned.
    """
    _raise_if_never_ran(out, name)
    tail = clean_text(out.output.decode("utf-8", "replace"), 4000, keep="tail")
    if out.timed_out:
        return {"stage": "timeout", "error": tail}
    report = _checked_report(out, spec)
    if report is not None:
        return report
    how, tail = _how_smoke_ended(out, limits, tail)
    return {"stage": "crash", "how": how, "error": tail}


def _checked_report(out: _Outcome, spec: dict) -> dict | None:
    """The report the smoke test sent, when it has one of the expected forms (None else)."""
    r = out.smoke
    if out.done and isinstance(r, dict) and isinstance(r.get("error", ""), str):
        stage, error = r.get("stage"), clean_text(r.get("error", ""), 16000, keep="tail")
        if stage == "ok" and set(r) == {"stage"}:
            return {"stage": "ok"}
        if stage == "core" and r.get("step") in SMOKE_STEPS and set(r) == {"stage", "step",
                                                                           "error"}:
            return {"stage": "core", "step": r["step"], "error": error}
        modules = spec["modules"].get(r.get("pin"), []) if isinstance(r.get("pin"), str) else []
        if stage == "import" and r.get("module") in modules and \
                set(r) == {"stage", "pin", "module", "error"}:
            return {"stage": "import", "pin": r["pin"], "module": r["module"], "error": error}
    return None


def _how_smoke_ended(out: _Outcome, limits: Limits, tail: str) -> tuple[str, str]:
    """How a smoke test without a valid report ended, and the text to show with it."""
    if out.oom or out.stopped == "memory":
        how = f"it ran out of memory under the sandbox's limit of {_gib(limits)}"
    elif out.stopped == "processes" or out.pids_refused:
        how = f"it reached the sandbox's limit of {limits.max_processes} processes"
    elif out.stopped == "output":
        how = f"it printed more than {OUTPUT_STOP >> 20} MiB"
    elif out.channel_error or out.exception is not None or out.done:
        how = "it sent a malformed report: " + clean_text(
            out.channel_error or str(out.exception or "not the expected fields"), 300)
    elif out.error is not None:
        how = "its interpreter failed while adding the site-packages: " + clean_text(
            out.error.get("message", ""), 2000)
        tail = clean_text(out.error.get("traceback", ""), 8000, keep="tail") + "\n" + tail
    else:
        rc = out.returncode
        how = ("the interpreter was killed by a signal" if rc is None or rc < 0 or rc >= 128
               else f"the interpreter exited with code {rc}")
    return how, tail


# ----------------------------------------------------------------------------------------------
# determinism, checked from outside


def _deterministic(name: str, views: Views, main: _Outcome, again: _Outcome) -> list[str]:
    """The contract checks passed, once the re-run's arrays match the full run's byte for byte.

    ``again`` re-scored the first seed's views (and first draw) in a fresh sandbox; a difference
    raises ``EstimatorContractError``.
    """
    from benchmark.contract import EstimatorContractError

    who = main.meta["class"]
    checks = ["capabilities (name, track, tasks)",
              "__init__ stores its hyperparameters (JSON config)"]
    for key, method, args, n in score_calls(views, main.meta["tasks"], subset=True):
        a, b = main.arrays[key], again.arrays[key]
        if a.tobytes() != b.tobytes():
            what = (f"{args[0].granularity} view" if method == "score_rollouts"
                    else f"draw {args[1].draw_id}")
            raise EstimatorContractError(
                f"estimator {name}: {who}.{method} is not deterministic: two runs in "
                f"fresh sandboxes on the same {what} differ at {int((a != b).sum())} "
                "units; seed any randomness from view.seed.")
        checks.append(f"score_rollouts on the {args[0].granularity} view: shape ({n},), "
                      "finite, deterministic, inputs unchanged" if method == "score_rollouts"
                      else f"score_draw on draw {args[1].draw_id}: shape ({n},), finite, "
                      "deterministic, inputs unchanged")
    return checks
