"""Running an untrusted estimator in a limited child process.

The parent exports the label-free views of every seed to a folder of ``.npy`` files (the *view
folder*), then starts ``python -m benchmark.isolation`` with a wall-time limit. The child applies
:mod:`benchmark.sandbox` to itself (memory limit, empty network namespace, Landlock: read-only
access to the Python installation, the ``benchmark``/``estimators`` packages, the estimator file,
the view folder and the release's checkpoint and tokenizer folders; read-write access to a scratch
folder only), then loads the estimator, runs the contract checks and scores every view and draw.
Scores come back through the scratch folder as ``.npy`` files named by a manifest; the parent
validates every array (shape, dtype, finite) before using it. A crash, a timeout, a memory error
or a broken contract ends in an :class:`IsolationError` naming the estimator, the limit or the
problem, and the fix; nothing is written to the results.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmark.errors import BenchmarkError
from benchmark.view import DrawView, RunView

_RUN_FIELDS = ("sketches", "steps", "groups", "advantages", "fluency", "rewards")
_DRAW_FIELDS = ("sketches", "groups", "fluency")
STATUS = "status.json"


class IsolationError(BenchmarkError):
    """The estimator's child process failed: crash, limit, sandbox violation or bad output."""


@dataclass(frozen=True)
class Limits:
    """Limits of the estimator's child process (defaults fit the ``tiny`` release).

    Attributes:
        wall_seconds: wall-clock limit for loading, checking and scoring every seed.
        memory_bytes: address-space limit (``RLIMIT_AS``); Python + torch need about 1 GiB.
    """

    wall_seconds: float = 600.0
    memory_bytes: int = 6 << 30


# ----------------------------------------------------------------------------------------------
# view folder


def _save(path: Path, arr: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(arr), allow_pickle=False)


def export_views(views: dict[int, tuple[RunView, RunView, list[DrawView]]], dst: Path) -> None:
    """Write the label-free views of each seed under ``dst/seed<S>/`` (``.npy`` + ``meta.json``)."""
    for seed, (rv, sv, draws) in views.items():
        d = dst / f"seed{seed}"
        (d / "targets").mkdir(parents=True)
        for v in (rv, sv):
            (d / v.granularity).mkdir()
            for f in _RUN_FIELDS:
                a = getattr(v, f)
                if a is not None:
                    _save(d / v.granularity / f"{f}.npy", a)
        for name, t in rv.targets.items():
            _save(d / "targets" / f"{name}.npy", t)
        for dv in draws:
            (d / "draws" / dv.draw_id).mkdir(parents=True)
            for f in _DRAW_FIELDS:
                _save(d / "draws" / dv.draw_id / f"{f}.npy", getattr(dv, f))
        meta = {
            "seed": rv.seed, "checkpoint_steps": list(rv.checkpoint_steps), "lr": rv.lr,
            "n_steps": rv.n_steps, "track": rv.track,
            "checkpoint_dir": {str(k): str(p) for k, p in rv.checkpoint_dir.items()},
            "tokenizer_dir": str(rv.tokenizer_dir) if rv.tokenizer_dir else None,
            "draws": [{"draw_id": dv.draw_id, "checkpoint_step": dv.checkpoint_step,
                       "responses": list(dv.responses) if dv.responses else None}
                      for dv in draws],
            "prompts": list(rv.prompts) if rv.prompts else None,
            "responses": list(rv.responses) if rv.responses else None,
        }
        (d / "meta.json").write_text(json.dumps(meta))


def load_views(src: Path) -> dict[int, tuple[RunView, RunView, list[DrawView]]]:
    """Inverse of :func:`export_views` (arrays memory-mapped read-only)."""
    out = {}
    for d in sorted(src.glob("seed*")):
        meta = json.loads((d / "meta.json").read_text())
        targets = {p.stem: np.load(p, mmap_mode="r") for p in sorted((d / "targets").glob("*"))}
        common = {
            "seed": meta["seed"], "targets": targets,
            "checkpoint_steps": tuple(meta["checkpoint_steps"]), "lr": meta["lr"],
            "n_steps": meta["n_steps"], "track": meta["track"],
            "checkpoint_dir": {int(k): Path(p) for k, p in meta["checkpoint_dir"].items()},
            "tokenizer_dir": Path(meta["tokenizer_dir"]) if meta["tokenizer_dir"] else None,
        }
        views = []
        for gran in ("rollout", "step"):
            arrays = {f: np.load(d / gran / f"{f}.npy", mmap_mode="r")
                      for f in _RUN_FIELDS if (d / gran / f"{f}.npy").exists()}
            text = {}
            if gran == "rollout" and meta["prompts"] is not None:
                text = {"prompts": tuple(meta["prompts"]), "responses": tuple(meta["responses"])}
            views.append(RunView(granularity=gran, **arrays, **text, **common))
        draws = []
        for dm in meta["draws"]:
            dd = d / "draws" / dm["draw_id"]
            draws.append(DrawView(
                draw_id=dm["draw_id"], checkpoint_step=dm["checkpoint_step"],
                responses=tuple(dm["responses"]) if dm["responses"] else None,
                **{f: np.load(dd / f"{f}.npy", mmap_mode="r") for f in _DRAW_FIELDS}))
        out[int(meta["seed"])] = (views[0], views[1], draws)
    return out


# ----------------------------------------------------------------------------------------------
# parent side


def _allowed_read_paths(estimator_file: Path, view_dir: Path,
                        views: dict[int, tuple[RunView, RunView, list[DrawView]]]) -> list[str]:
    import benchmark
    import estimators

    paths = {"/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", "/sys", sys.prefix,
             sys.base_prefix, sys.exec_prefix, str(Path(benchmark.__file__).parent),
             str(Path(estimators.__file__).parent), str(estimator_file), str(view_dir)}
    paths |= {p for p in sys.path if p and Path(p).is_dir() and "site-packages" in p}
    for rv, _, _ in views.values():
        dirs = [*rv.checkpoint_dir.values(), *([rv.tokenizer_dir] if rv.tokenizer_dir else [])]
        paths |= {str(p) for p in dirs}
        # a release in the Hugging Face cache holds symlinks into blobs/: grant their targets
        # one by one (granting blobs/ itself would expose the labels)
        paths |= {os.path.realpath(f) for d in dirs for f in Path(d).rglob("*")
                  if f.is_symlink() and f.is_file()}
    return sorted(paths)


def _refuse_label_exposure(read: list[str], forbidden: list[Path]) -> None:
    for f in forbidden:
        f = f.resolve()
        for p in read:
            rp = Path(p).resolve()
            if f == rp or rp in f.parents:
                raise IsolationError(
                    f"the estimator sandbox would be able to read {f} through the allowed path "
                    f"{rp}; keep releases outside {rp} (e.g. not inside the Python installation)."
                )


def _spawn(estimator_file: Path, mode: str, views: dict | None, forbidden: list[Path],
           limits: Limits) -> tuple[dict, Path, tempfile.TemporaryDirectory]:
    """Run the child in ``mode`` ("inspect" or "score"); return its status and scratch folder."""
    tmpdir = tempfile.TemporaryDirectory(prefix="bt-bench-isolation-")
    tmp_path = Path(tmpdir.name)
    view_dir, scratch = tmp_path / "view", tmp_path / "scratch"
    scratch.mkdir()
    view_dir.mkdir()
    if views:
        export_views(views, view_dir)
    read = _allowed_read_paths(estimator_file, view_dir, views or {})
    _refuse_label_exposure(read, forbidden)
    config = {"mode": mode, "estimator": str(estimator_file), "view": str(view_dir),
              "scratch": str(scratch), "read": read, "write": [str(scratch), "/dev"],
              "memory_bytes": limits.memory_bytes}
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "OMP_NUM_THREADS",
                    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MKL_NUM_THREADS")}
    env.update({"HOME": str(scratch), "TMPDIR": str(scratch), "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "PYTHONDONTWRITEBYTECODE": "1", "NO_PROXY": "*"})
    cmd = [sys.executable, "-m", "benchmark.isolation", str(tmp_path / "config.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=str(scratch), start_new_session=True)
    name = estimator_file.name
    try:
        out, _ = proc.communicate(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        tmpdir.cleanup()
        raise IsolationError(
            f"estimator {name} exceeded the wall-time limit of {limits.wall_seconds:g} s and "
            "was stopped; make it faster or raise the limit (--time-limit SECONDS)."
        ) from None
    tail = out.decode("utf-8", "replace")[-2000:]
    status_path = scratch / STATUS
    if not status_path.exists():
        tmpdir.cleanup()
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with code {proc.returncode}")
        raise IsolationError(
            f"estimator {name}: its process {how} before returning its scores; an estimator "
            "must return scores, never exit the process (a kill by signal 9 can also mean the "
            f"memory limit of {limits.memory_bytes / 2**30:.1f} GiB). Last output:\n{tail}"
        )
    status = json.loads(status_path.read_text())
    if not status.get("ok"):
        tmpdir.cleanup()
        from benchmark.contract import EstimatorContractError

        cls = EstimatorContractError if status.get("kind") == "contract" else IsolationError
        raise cls(f"estimator {name}: {status['error']}")
    return status, scratch, tmpdir


def inspect_isolated(estimator_file: Path, limits: Limits | None = None) -> dict:
    """Load the estimator file in a sandboxed child and return its declared metadata.

    Returns:
        ``{"name", "class", "track", "tasks", "config", "sha256"}``; the file's code never runs in
        the calling process.
    """
    from benchmark.contract import file_sha256

    estimator_file = Path(estimator_file).resolve()
    status, _, tmpdir = _spawn(estimator_file, "inspect", None, [], limits or Limits())
    tmpdir.cleanup()
    return status["meta"] | {"sha256": file_sha256(estimator_file)}


def score_isolated(
    estimator_file: Path,
    views: dict[int, tuple[RunView, RunView, list[DrawView]]],
    forbidden: list[Path],
    limits: Limits | None = None,
) -> tuple[dict[int, dict], dict]:
    """Check and score an estimator in a sandboxed child process.

    Args:
        estimator_file: the estimator's ``.py`` file.
        views: seed -> (rollout view, step view, draws), built by the evaluator.
        forbidden: label files the child must not be able to read (checked before it starts).
        limits: wall-time and memory limits.

    Returns:
        ``(scores, info)``: scores[seed] = ``{"rollout": (n,), "step": (n_steps,),
        "draws": {draw_id: (m,)}}`` float64 arrays (validated: shape, dtype, finite), and
        ``info`` with the contract checks that passed and the protections that were active.

    Raises:
        IsolationError / EstimatorContractError: the child failed; nothing was scored.
    """
    limits = limits or Limits()
    estimator_file = Path(estimator_file).resolve()
    status, scratch, tmpdir = _spawn(estimator_file, "score", views, forbidden, limits)
    try:
        scores = _read_scores(scratch, views, estimator_file.name)
    finally:
        tmpdir.cleanup()
    return scores, {"contract_checks": status["contract_checks"],
                    "protections": status["protections"], "limits": asdict(limits)}


def _read_scores(scratch: Path, views: dict, name: str) -> dict[int, dict]:
    from benchmark.contract import validate_scores

    out: dict[int, dict] = {}
    for seed, (rv, sv, draws) in views.items():
        entry: dict = {"draws": {}}
        for key, n in (("rollout", rv.n), ("step", sv.n)):
            arr = np.load(scratch / f"seed{seed}_{key}.npy", allow_pickle=False)
            entry[key] = validate_scores(arr, n, name, "score_rollouts")
        for d in draws:
            p = scratch / f"seed{seed}_draw_{d.draw_id}.npy"
            if p.exists():
                entry["draws"][d.draw_id] = validate_scores(
                    np.load(p, allow_pickle=False), d.n, name, "score_draw")
        out[seed] = entry
    return out


# ----------------------------------------------------------------------------------------------
# child side


def _child(config_path: str) -> int:  # pragma: no cover - runs in the child process
    cfg = json.loads(Path(config_path).read_text())
    scratch = Path(cfg["scratch"])
    status_path = scratch / STATUS

    def finish(status: dict) -> int:
        tmp = scratch / (STATUS + ".tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, status_path)
        return 0

    from benchmark import sandbox

    try:
        protections = sandbox.apply(cfg["read"], cfg["write"], cfg["memory_bytes"])
    except OSError as exc:
        return finish({"ok": False, "kind": "sandbox",
                       "error": f"the sandbox could not be set up ({exc}); rerun with "
                                "--no-isolation only for code you trust."})
    try:
        from benchmark.contract import (
            EstimatorContractError,
            check_estimator,
            load_estimator_file,
        )

        loaded = load_estimator_file(cfg["estimator"])
        if cfg["mode"] == "inspect":
            from benchmark.contract import check_capabilities, get_params

            check_capabilities(loaded.cls, loaded.path)
            meta = {"name": loaded.name, "class": loaded.cls.__name__,
                    "track": loaded.cls.track, "tasks": list(loaded.cls.tasks),
                    "config": get_params(loaded.instantiate())}
            return finish({"ok": True, "meta": meta, "protections": protections})
        views = load_views(Path(cfg["view"]))
        first = views[min(views)]
        report = check_estimator(loaded, [first[0], first[1]], first[2])
        est = loaded.instantiate()
        for seed, (rv, sv, draws) in views.items():
            np.save(scratch / f"seed{seed}_rollout.npy", np.asarray(est.score_rollouts(rv)))
            np.save(scratch / f"seed{seed}_step.npy", np.asarray(est.score_rollouts(sv)))
            if "draws" in loaded.cls.tasks:
                for d in draws:
                    np.save(scratch / f"seed{seed}_draw_{d.draw_id}.npy",
                            np.asarray(est.score_draw(rv, d)))
    except EstimatorContractError as exc:
        return finish({"ok": False, "kind": "contract", "error": str(exc)})
    except MemoryError as exc:
        return finish({"ok": False, "kind": "memory", "error":
                       f"ran out of memory under the limit of {cfg['memory_bytes'] / 2**30:.1f} "
                       f"GiB ({exc}); use less memory (stream the sketches in chunks) or raise "
                       "the limit (--memory-limit)."})
    except PermissionError as exc:
        return finish({"ok": False, "kind": "sandbox", "error":
                       f"was denied access by the sandbox ({exc}); an estimator may read only "
                       "its view (no labels, no release folder, no network) and write nowhere."})
    except BaseException as exc:  # noqa: BLE001 - report every failure of untrusted code
        return finish({"ok": False, "kind": "error",
                       "error": f"raised {type(exc).__name__}: {exc}"})
    return finish({"ok": True, "contract_checks": [c for c, _, _ in report.checks],
                   "protections": protections})


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child(sys.argv[1]))
