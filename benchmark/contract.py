"""Loading an estimator file and checking it against the estimator contract.

``check_estimator`` is public API (``bt-bench check-estimator FILE``) and the first thing
``bt-bench evaluate`` runs; the rules are listed in :mod:`estimators.base`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark.errors import BenchmarkError
from benchmark.untrusted import clean_text, quote
from benchmark.view import DrawView, RunView

#: an estimator's ``track``: ``"gradient"`` (sketches, advantages, fluency, targets,
#: checkpoints) or ``"open"`` (also text, token ids and task rewards)
TRACKS = ("gradient", "open")
#: what an estimator may score (``tasks``): rollouts always, draws with ``score_draw``
TASKS = ("rollouts", "draws")
#: the views where an estimator may declare a generic fallback (``fallbacks``)
FALLBACK_VIEWS = ("step", "draws")
#: longest estimator ``name`` (printable characters only)
MAX_NAME = 64
#: most hyperparameters, and longest string hyperparameter, recorded as the config
MAX_CONFIG_KEYS, MAX_CONFIG_STR = 64, 256


class EstimatorContractError(BenchmarkError):
    """An estimator file or class breaks the estimator contract.

    Attributes:
        headline: the message without the estimator's traceback.
        estimator_tb: the estimator's own traceback ("" when the error is not the estimator's
            exception), raw: show it with :func:`benchmark.untrusted.quote`.
    """

    def __init__(self, message: str, estimator_tb: str = "") -> None:
        self.headline, self.estimator_tb = message, estimator_tb
        super().__init__(message + quote(estimator_tb, "the estimator's traceback"))


@dataclass
class LoadedEstimator:
    """An estimator class loaded from a file, with what the results record about it."""

    path: Path
    cls: type
    sha256: str

    @property
    def name(self) -> str:
        """The estimator's declared ``name``."""
        return str(self.cls.name)

    def instantiate(self) -> object:
        """Construct with default hyperparameters."""
        try:
            return self.cls()
        except Exception as exc:  # the user's constructor failed
            raise EstimatorContractError(
                f"{self.path}: {self.cls.__name__}() failed with {type(exc).__name__}: {exc}; "
                "every constructor argument needs a default, and __init__ must only store them."
            ) from exc


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_estimator_path(path: str | Path) -> Path:
    """Raise unless ``path`` is an existing regular ``.py`` file; return it as a Path."""
    p = Path(path)
    if not p.is_file():
        raise EstimatorContractError(
            f"{p}: estimator file not found; pass the path of a .py file with one estimator "
            "class (see estimators/examples/my_estimator.py)."
        )
    if p.suffix != ".py":
        raise EstimatorContractError(
            f"{p}: expected a Python file ending in .py, got {p.suffix or 'no suffix'!r}."
        )
    return p


def estimator_traceback(exc: BaseException, path: str | Path | None) -> str:
    """The estimator's own part of ``exc``'s traceback: its frames (file, line, code) and the error.

    Frames before the first one in ``path`` (the harness calling the estimator) are left out;
    without such a frame the whole traceback is kept. The text is the estimator's: show it with
    :func:`benchmark.untrusted.quote`.
    """
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        target = str(Path(path))
        first = next((i for i, f in enumerate(frames) if f.filename == target), None)
        if first is not None:
            frames = frames[first:]
    lines = traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _class_file(cls: type) -> str | None:
    mod = sys.modules.get(getattr(cls, "__module__", ""), None)
    return getattr(mod, "__file__", None)


def load_estimator_file(path: str | Path) -> LoadedEstimator:
    """Import ``path`` as a module and return its single estimator class.

    An estimator class is a class defined in that file with a callable ``score_rollouts``.

    Raises:
        EstimatorContractError: missing file, not a ``.py`` file, syntax or import error, or not
            exactly one estimator class (the message lists what was found and the fix).
    """
    p = check_estimator_path(path)
    digest = file_sha256(p)
    mod_name = f"bt_bench_estimator_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise EstimatorContractError(f"{p}: cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(mod_name, None)
        raise EstimatorContractError(
            f"{p}:{exc.lineno}: syntax error: {exc.msg}; fix the file and rerun."
        ) from exc
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise EstimatorContractError(
            f"{p}: importing the file raised {type(exc).__name__}: "
            f"{clean_text(exc, 500, multiline=False)}; an estimator file may import only "
            "installed packages (numpy, torch, ... and the exact pins it declares: "
            "--requirements PIN, or requirements: in submission.yaml) and must not run work "
            "at import.",
            estimator_traceback(exc, p),
        ) from exc
    classes = [
        obj for _, obj in inspect.getmembers(module, inspect.isclass)
        if obj.__module__ == mod_name and callable(getattr(obj, "score_rollouts", None))
    ]
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise EstimatorContractError(
            f"{p}: expected exactly one estimator class (a class defined in the file with a "
            f"score_rollouts method), found {len(classes)}: {found}. Keep one estimator per file; "
            "move helpers into functions or rename their scoring method."
        )
    return LoadedEstimator(path=p, cls=classes[0], sha256=digest)


def check_capabilities(cls: type, path: Path | str = "") -> None:
    """Validate the declared capabilities (``name``, ``track``, ``tasks``) of a class."""
    where = f"{path}: " if path else ""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise EstimatorContractError(
            f"{where}{cls.__name__}.name must be a non-empty string class attribute, got "
            f"{clean_text(repr(name), 80, multiline=False)}; e.g. name = \"my-estimator\"."
        )
    if len(name) > MAX_NAME or not name.isprintable() or name != name.strip():
        raise EstimatorContractError(
            f"{where}{cls.__name__}.name must be at most {MAX_NAME} printable characters "
            "without control or escape characters or surrounding spaces, got "
            f"{clean_text(ascii(name), 80, multiline=False)}; e.g. name = \"my-estimator\"."
        )
    track = getattr(cls, "track", None)
    if track not in TRACKS:
        raise EstimatorContractError(
            f"{where}{cls.__name__}.track must be one of {TRACKS}, got {track!r}."
        )
    tasks = getattr(cls, "tasks", None)
    if not isinstance(tasks, tuple | list) or not tasks or any(t not in TASKS for t in tasks):
        raise EstimatorContractError(
            f"{where}{cls.__name__}.tasks must be a non-empty tuple drawn from {TASKS}, got "
            f"{tasks!r}."
        )
    if "rollouts" not in tasks:
        raise EstimatorContractError(
            f"{where}{cls.__name__}.tasks must include 'rollouts' (every estimator scores the "
            f"training rollouts), got {tasks!r}."
        )
    if "draws" in tasks and not callable(getattr(cls, "score_draw", None)):
        raise EstimatorContractError(
            f"{where}{cls.__name__} declares 'draws' in tasks but has no score_draw method."
        )
    fb = getattr(cls, "fallbacks", ())
    if not isinstance(fb, tuple | list) or any(v not in FALLBACK_VIEWS for v in fb) \
            or ("draws" in fb and "draws" not in tasks):
        raise EstimatorContractError(
            f"{where}{cls.__name__}.fallbacks must be a tuple drawn from {FALLBACK_VIEWS} (the "
            "views where the method falls back to a generic sketch score; 'draws' only when "
            f"it scores draws), got {clean_text(repr(fb), 80, multiline=False)}."
        )


def get_params(est: object) -> dict[str, object]:
    """The estimator's hyperparameters: the constructor arguments read back from attributes."""
    sig = inspect.signature(type(est).__init__)
    params = {}
    for p in sig.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if not hasattr(est, p.name):
            raise EstimatorContractError(
                f"{type(est).__name__}.__init__ takes {p.name!r} but does not store it as "
                f"self.{p.name}; __init__ must store every hyperparameter under its own name."
            )
        params[p.name] = getattr(est, p.name)
    problem = config_problem(params)
    if problem:
        raise EstimatorContractError(
            f"{type(est).__name__} hyperparameters are not plain JSON scalars: {problem}; use "
            f"numbers, booleans, None or strings of at most {MAX_CONFIG_STR} printable "
            "characters, so the config can be recorded."
        )
    return params


def config_problem(config: object) -> str:
    """What makes ``config`` unfit for ``results.json`` ("" when it is fine).

    A config is a dict of at most :data:`MAX_CONFIG_KEYS` hyperparameters named by Python
    identifiers, each a JSON scalar: None, a boolean, an integer below 2**63 in size, a finite
    float, or a string of at most :data:`MAX_CONFIG_STR` printable characters.
    """
    if not isinstance(config, dict):
        return f"the config is a {type(config).__name__}, not a dict"
    if len(config) > MAX_CONFIG_KEYS:
        return f"{len(config)} hyperparameters (at most {MAX_CONFIG_KEYS})"
    for k, v in config.items():
        if not isinstance(k, str) or not k.isidentifier() or len(k) > 64:
            return f"hyperparameter name {clean_text(ascii(k), 80, multiline=False)}"
        what = clean_text(k, 64, multiline=False)
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int):
            if abs(v) >= 2**63:
                return f"{what} is an integer of {v.bit_length()} bits"
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return f"{what} is {v}"
        elif isinstance(v, str):
            if len(v) > MAX_CONFIG_STR or not v.isprintable():
                return (f"{what} is a string of {len(v)} characters"
                        + ("" if v.isprintable() else " with control or escape characters"))
        else:
            return f"{what} is a {type(v).__name__}"
    return ""


def validate_scores(scores: object, n: int, who: str, what: str) -> np.ndarray:
    """Return ``scores`` as float64 ``(n,)`` or raise naming the estimator and the problem.

    Scores are real numbers: floats, integers or booleans (a list or a torch tensor of them is
    converted). Refused: objects, strings, complex numbers, ``timedelta64``/``datetime64`` (numpy
    counts timedelta64 among the integers), and masked arrays (converting one would drop its
    mask silently).
    """
    if not isinstance(scores, np.ndarray):
        try:
            import torch

            if isinstance(scores, torch.Tensor):
                scores = scores.detach().cpu().numpy()
        except ImportError:  # pragma: no cover
            pass
    if isinstance(scores, np.ma.MaskedArray):
        raise EstimatorContractError(
            f"{who}.{what} returned a masked array (numpy.ma.MaskedArray); return a numeric "
            f"numpy array of shape ({n},) (a mask is not kept: fill the masked entries with the "
            "scores they should have, e.g. scores.filled(value))."
        )
    arr = np.asarray(scores)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise EstimatorContractError(
            f"{who}.{what} returned dtype {arr.dtype}; return a numeric numpy array of shape "
            f"({n},)."
        )
    if arr.shape != (n,):
        raise EstimatorContractError(
            f"{who}.{what} returned shape {arr.shape}; expected ({n},), one score per unit "
            "(view.n) or per response (draw.n)."
        )
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.flatnonzero(bad)[:5].tolist()
        raise EstimatorContractError(
            f"{who}.{what} returned {int(bad.sum())} non-finite scores (NaN or inf) at positions "
            f"{idx} (first 5); every score must be finite. Use a large finite value to rank a "
            "unit first or last."
        )
    return arr


def _fingerprint(view: RunView | DrawView) -> str:
    h = hashlib.sha256()
    for name in ("sketches", "steps", "groups", "advantages", "fluency"):
        a = getattr(view, name, None)
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    for k in sorted(getattr(view, "targets", {}) or {}):
        h.update(np.ascontiguousarray(view.targets[k]).tobytes())
    return h.hexdigest()


@dataclass
class ContractReport:
    """What ``check_estimator`` checked, each with ok / the message."""

    estimator: str
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(ok for _, ok, _ in self.checks)


def _call(est: object, method: str, *args: object) -> object:
    """Call ``est.method(*args)``; wrap its exception with the estimator's own traceback."""
    who = f"{type(est).__name__}.{method}"
    try:
        return getattr(est, method)(*args)
    except EstimatorContractError:
        raise
    except MemoryError:
        raise
    except Exception as exc:
        msg = clean_text(exc, 1000, multiline=False)
        tb = estimator_traceback(exc, _class_file(type(est)))
        if isinstance(exc, ValueError) and ("read-only" in msg or "not writeable" in msg):
            text = (f"{who} tried to modify its input in place ({msg}); views are read-only: "
                    "copy an array (np.array(x)) before changing it.")
        elif isinstance(exc, PermissionError):
            text = (f"{who} was denied access ({msg}); an estimator may read only its view (no "
                    "labels, no release folder), write only to /tmp and use no network.")
        else:
            text = f"{who} raised {type(exc).__name__}: {msg}"
        raise EstimatorContractError(text, tb) from exc


def check_estimator(
    loaded: LoadedEstimator, views: list[RunView], draws: list[DrawView] | None = None
) -> ContractReport:
    """Run the contract checks on a loaded estimator; raise at the first failure.

    Checks: capabilities; constructor stores its hyperparameters; ``score_rollouts`` on each of
    ``views`` returns finite float ``(n,)`` scores, identical on a repeat, without modifying its
    input; the same for ``score_draw`` on ``draws`` when ``"draws"`` is declared.

    Returns:
        A :class:`ContractReport` listing the checks that passed.
    """
    cls = loaded.cls
    who = cls.__name__
    report = ContractReport(estimator=who)
    check_capabilities(cls, loaded.path)
    report.checks.append(("capabilities (name, track, tasks)", True, ""))
    est = loaded.instantiate()
    get_params(est)
    report.checks.append(("__init__ stores its hyperparameters (JSON config)", True, ""))
    for view in views:
        before = _fingerprint(view)
        first = validate_scores(_call(est, "score_rollouts", view), view.n, who, "score_rollouts")
        second = validate_scores(_call(est, "score_rollouts", view), view.n, who, "score_rollouts")
        if _fingerprint(view) != before:
            raise EstimatorContractError(
                f"{who}.score_rollouts modified its input view; copy arrays before changing them."
            )
        if not np.array_equal(first, second):
            raise EstimatorContractError(
                f"{who}.score_rollouts is not deterministic: two calls on the same "
                f"{view.granularity} view differ at {int((first != second).sum())} units; seed "
                "any randomness from view.seed."
            )
        report.checks.append((f"score_rollouts on the {view.granularity} view: shape "
                              f"({view.n},), finite, deterministic, inputs unchanged", True, ""))
    if "draws" in cls.tasks and draws:
        view = views[0]
        for draw in draws[:1]:
            before = _fingerprint(draw)
            a = validate_scores(_call(est, "score_draw", view, draw), draw.n, who, "score_draw")
            b = validate_scores(_call(est, "score_draw", view, draw), draw.n, who, "score_draw")
            if _fingerprint(draw) != before:
                raise EstimatorContractError(f"{who}.score_draw modified its input draw.")
            if not np.array_equal(a, b):
                raise EstimatorContractError(
                    f"{who}.score_draw is not deterministic on draw {draw.draw_id}."
                )
            report.checks.append((f"score_draw on draw {draw.draw_id}: shape ({draw.n},), "
                                  "finite, deterministic, inputs unchanged", True, ""))
    return report
