"""The sandboxed side of the sandbox: ``python -S -m benchmark.sandbox.child CFG``.

In order: apply the inner layers (Landlock; without bubblewrap also an empty network namespace),
tell the evaluator it is ready and wait for its go (it checks the sandbox from outside first),
only then add the site-packages (the interpreter starts with ``-S``, so no ``.pth`` file,
``sitecustomize`` or requirement of a submission environment has run before this point), then
either load the estimator, send its declared metadata and score the calls of
:func:`benchmark.sandbox.view_io.score_calls` one by one, sending each array as soon as it exists,
or
(mode ``smoke``) run a submission environment's smoke test
(:func:`benchmark.sandbox.requirements.smoke_inside`) and send its report, or (mode ``build``)
build the wheel of a requirement's sdist (:func:`benchmark.sandbox.sdist.build_inside`) and send
the report and the wheel's bytes. Everything goes through
the
result channel (:mod:`benchmark.sandbox.channel`); stdout and stderr belong to the estimator.
Nothing
written here is trusted by the evaluator.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

#: errors that mean "the sandbox refused" rather than a bug of the estimator
_REFUSED = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSYS, errno.ENOENT, errno.ENETUNREACH,
            errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.ECONNREFUSED, errno.ENOSPC, errno.ENXIO}


def _apply_layers(cfg: dict) -> dict:
    from benchmark.sandbox import layers as sandbox

    if cfg["fallback"]:
        return sandbox.apply_fallback(cfg["read"], cfg["write"])
    return {"landlock": sandbox.apply_landlock(cfg["read"], cfg["write"])}


def enable_site() -> None:
    """Add the site-packages now: their ``.pth`` files and ``sitecustomize`` run from here on.

    The interpreter was started with ``-S`` so that this happens after Landlock and after the
    evaluator checked the sandbox. Processes started the way this one was (multiprocessing's
    spawn and forkserver copy the interpreter's flags) get their site-packages back: ``-S`` is
    dropped from the flags they copy.
    """
    import site
    import subprocess

    site.main()
    flags = subprocess._args_from_interpreter_flags
    subprocess._args_from_interpreter_flags = lambda: [a for a in flags() if a != "-S"]


def load_and_describe(path: str) -> tuple[object, dict]:
    """Load the estimator file; return it and its declared metadata (capabilities, config)."""
    from benchmark.contract import check_capabilities, get_params, load_estimator_file

    loaded = load_estimator_file(path)
    check_capabilities(loaded.cls, loaded.path)
    meta = {"name": loaded.name, "class": loaded.cls.__name__, "track": loaded.cls.track,
            "tasks": list(loaded.cls.tasks),
            "fallbacks": list(getattr(loaded.cls, "fallbacks", ())),
            "config": get_params(loaded.instantiate()),
            "has_score_draw": callable(getattr(loaded.cls, "score_draw", None))}
    return loaded, meta


def load(view_dir: str) -> dict:
    """The views to score: the view folder of :func:`benchmark.sandbox.view_io.export_views`."""
    from benchmark.sandbox.view_io import load_views

    return load_views(Path(view_dir))


def score(loaded: object, views: dict, tasks: list[str], subset: bool, fd: int) -> None:
    """Score every call of :func:`benchmark.sandbox.view_io.score_calls`; send each at once."""
    from benchmark.contract import _call, validate_scores
    from benchmark.sandbox.channel import send_array
    from benchmark.sandbox.view_io import score_calls

    est = loaded.instantiate()
    who = loaded.cls.__name__
    for key, method, args, n in score_calls(views, tasks, subset):
        send_array(fd, key, validate_scores(_call(est, method, *args), n, who, method))


def _error_frame(exc: BaseException, estimator: str) -> dict:
    from benchmark.contract import EstimatorContractError, estimator_traceback
    from benchmark.untrusted import clean_text

    cause = exc.__cause__ if isinstance(exc, EstimatorContractError) and exc.__cause__ else exc
    kind = "error"
    if isinstance(exc, MemoryError) or isinstance(cause, MemoryError):
        kind = "memory"
    elif isinstance(cause, OSError) and cause.errno in _REFUSED:
        kind = "refused"
    elif isinstance(exc, EstimatorContractError):
        kind = "contract"
    try:
        tb = exc.estimator_tb if isinstance(exc, EstimatorContractError) else \
            estimator_traceback(exc, estimator)
        message = exc.headline if isinstance(exc, EstimatorContractError) else \
            f"raised {type(exc).__name__}: {clean_text(exc, 2000, multiline=False)}"
    except Exception as inner:  # noqa: BLE001 - a hostile exception
        tb, message = "", f"raised an exception that cannot be shown ({type(inner).__name__})"
    return {"type": "error", "kind": kind, "message": clean_text(message, 16000),
            "traceback": clean_text(tb, 16000)}


def main(argv: list[str]) -> int:  # pragma: no cover - runs inside the sandbox
    """Run the child; the exit code does not matter (the evaluator reads the channel)."""
    cfg = json.loads(argv[1])
    fd = cfg["channel"]
    from benchmark.sandbox.channel import send_json

    layers = _apply_layers(cfg)
    send_json(fd, {"type": "ready", "pid": os.getpid(), "layers": layers})
    if os.read(cfg["go"], 1) != b"g":
        return 1
    os.close(cfg["go"])
    try:
        enable_site()
        if cfg["mode"] == "build":
            import numpy as np

            from benchmark.sandbox.channel import send_array
            from benchmark.sandbox.sdist import build_inside

            report, wheel = build_inside(cfg["smoke"])
            send_json(fd, {"type": "build", "result": report})
            if wheel is not None:
                send_array(fd, "wheel", np.frombuffer(wheel, np.uint8))
            send_json(fd, {"type": "done"})
            return 0
        if cfg["mode"] == "smoke":
            from benchmark.sandbox.requirements import smoke_inside

            send_json(fd, {"type": "smoke", "result": smoke_inside(cfg["smoke"])})
            send_json(fd, {"type": "done"})
            return 0
        loaded, meta = load_and_describe(cfg["estimator"])
        send_json(fd, {"type": "meta", "meta": meta})
        if cfg["mode"] == "score":
            score(loaded, load(cfg["view"]), meta["tasks"], cfg["subset"], fd)
        send_json(fd, {"type": "done"})
    except BaseException as exc:  # noqa: BLE001 - report every failure of untrusted code
        try:
            send_json(fd, _error_frame(exc, cfg["estimator"]))
        except BaseException:  # noqa: BLE001
            return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv))
