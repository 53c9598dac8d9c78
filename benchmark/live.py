"""Live draws (issue 23): every entry is also scored on a run that did not exist before.

A *live draw* is a run sampled from the task family (:mod:`benchmark.build.family`) by a draw id
chosen when scoring happens, built on this machine with a **lean** causal reference (the oracle,
the controls' removal curves, :data:`LIVE_N_RANDOM` random sets per k and the bonus-off replay;
no exact-replay proof, no provenance row; ``benchmark.causal.reference.reference(lean=True)``).
The built release is kept in the cache
(:func:`live_dir`) and reused while its manifest verifies.

* ``bt-bench live build ID``: build (or find) a draw; ``bt-bench evaluate FILE --live ID``
  scores an estimator on it;
* the season panel's draws are live draws (:mod:`benchmark.submissions.panel`): every entry is
  ranked on the same ones, drawn after it was frozen;
* ``bt-bench verify`` scores every entry on one new draw of its own choosing, failing an entry
  whose public claim does not survive it (:func:`live_gate`).

From family 2.0 a draw is a float64 build: the same id trains the same run on every machine,
token for token, and its manifest records the trajectory hash that shows it
(:mod:`benchmark.build.trajectory`).

A live release's manifest is deterministic on one machine: build and reference times are kept
out of it, in ``live.json`` beside it (not a release file), so a rebuild of the same id has the
same manifest sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from benchmark.errors import BuildError, ReleaseError

#: the run scale of live draws (``benchmark.build.family.SCALES``; ``micro-family`` for tests)
LIVE_SCALE = "family"
#: random removal sets per k in a live draw's lean reference (the full reference ships 8)
LIVE_N_RANDOM = 4
#: environment variable that pins the draw id of ``verify``'s live check
LIVE_DRAW_ENV = "BT_BENCH_LIVE_DRAW"
#: build and reference times of a live release, beside its manifest (not one of its files)
LIVE_FILE = "live.json"
#: the cached draw's seal: an HMAC of its identity and manifest under this machine's key
#: (:mod:`benchmark.seal`), beside the manifest; a draw without a valid one is rebuilt
SEAL_FILE = "live.seal"
#: draw ids are drawn uniformly from ``[0, DRAW_ID_RANGE)``
DRAW_ID_RANGE = 2**31


def live_dir(draw_id: int, scale: str = LIVE_SCALE) -> Path:
    """The cache folder of a live draw: ``<cache>/live/<scale>-draw<ID>/`` (a release folder).

    ``<cache>`` is ``$BT_BENCH_CACHE`` or ``~/.cache/bt-bench``
    (:func:`benchmark.io.cache_root`).
    """
    from benchmark.io import cache_root

    return cache_root() / "live" / f"{scale}-draw{check_draw_id(draw_id)}"


#: the longest draw id string read (``2**31 - 1`` has 10 digits; leading zeros allowed)
MAX_DRAW_ID_CHARS = 20


def check_draw_id(draw_id: object) -> int:
    """``draw_id`` (an integer, or a string of ASCII digits) as an int in ``[0, 2**31)``.

    Untrusted input (results.json, ``$BT_BENCH_LIVE_DRAW``): bools, other digit scripts
    (``'²'``, ``'٧'``, ``'７'``), signs, spaces and strings over :data:`MAX_DRAW_ID_CHARS`
    characters are refused before any conversion.

    Raises:
        BuildError: naming the bad value, the expected form and an example.
    """
    import numbers

    d = -1
    if isinstance(draw_id, numbers.Integral) and not isinstance(draw_id, bool):
        d = int(draw_id)
    elif (isinstance(draw_id, str) and 0 < len(draw_id) <= MAX_DRAW_ID_CHARS
          and draw_id.isascii() and draw_id.isdigit()):
        d = int(draw_id)
    if not 0 <= d < DRAW_ID_RANGE:
        if isinstance(draw_id, int) and draw_id.bit_length() > 64:
            shown = f"<an integer of {draw_id.bit_length()} bits>"  # repr() would raise
        else:
            shown = repr(draw_id) if len(repr(draw_id)) <= 40 else repr(draw_id)[:40] + "..."
        raise BuildError(f"live draw id {shown} is not valid; expected an integer in "
                         f"[0, {DRAW_ID_RANGE}) written in ASCII digits (no sign, space or "
                         "other script); give one, e.g. --live-draw 7")
    return d


def new_draw_id() -> int:
    """A fresh draw id, uniform in ``[0, 2**31)`` from the OS's entropy (``secrets``)."""
    return secrets.randbelow(DRAW_ID_RANGE)


def gate_draw_id(pinned: int | None = None) -> tuple[int, str]:
    """The draw id of ``verify``'s live check and where it came from.

    ``pinned`` (``--live-draw``) first, then ``$BT_BENCH_LIVE_DRAW``, else :func:`new_draw_id`.
    Returns ``(draw_id, "--live-draw" | "$BT_BENCH_LIVE_DRAW" | "chosen by this run")``.
    """
    if pinned is not None:
        return check_draw_id(pinned), "--live-draw"
    env = os.environ.get(LIVE_DRAW_ENV)
    if env not in (None, ""):
        return check_draw_id(env), f"${LIVE_DRAW_ENV}"
    return new_draw_id(), "chosen by this run"


def cached_release(draw_id: int, scale: str = LIVE_SCALE) -> Path | None:
    """The cached live release of ``draw_id`` when it is complete and verifies, else None.

    Complete: its manifest verifies (every file's sha256), records this family version, draw id
    and scale, lists a causal reference for every seed, and the folder carries this machine's
    seal over that manifest (:func:`seal_draw`): a draw whose files were edited with the manifest
    rewritten to match, or one brought from another machine's cache, is not taken on its word.
    """
    from benchmark.build.family import FAMILY_VERSION
    from benchmark.causal.score import CAUSAL_FILE
    from benchmark.releases.release import MANIFEST, load_release

    path = live_dir(draw_id, scale)
    if not (path / MANIFEST).is_file() or not _sealed(path, draw_id, scale):
        return None
    try:
        rel = load_release(path, verify=True)
    except (ReleaseError, ValueError, KeyError, OSError):
        return None
    fam = rel.manifest.get("build", {}).get("family") or {}
    files = rel.manifest.get("files", {})
    if (fam.get("version"), fam.get("draw_id"), fam.get("scale")) != \
            (FAMILY_VERSION, int(draw_id), scale) or \
            any(f"seed{s}/{CAUSAL_FILE}" not in files for s in rel.seeds):
        return None
    return path


def _seal_parts(path: Path, draw_id: int, scale: str) -> tuple:
    from benchmark.build.family import FAMILY_VERSION
    from benchmark.releases.release import MANIFEST

    return ("bt-bench live draw", scale, str(int(draw_id)), FAMILY_VERSION,
            (Path(path) / MANIFEST).read_bytes())


def seal_draw(path: Path, draw_id: int, scale: str) -> None:
    """Write the draw folder's seal (:data:`SEAL_FILE`) under this machine's key."""
    from benchmark.io import atomic_write_text
    from benchmark.seal import tag

    atomic_write_text(Path(path) / SEAL_FILE, tag(*_seal_parts(path, draw_id, scale)))


def _sealed(path: Path, draw_id: int, scale: str) -> bool:
    from benchmark.seal import verify

    try:
        return verify((Path(path) / SEAL_FILE).read_text(encoding="ascii", errors="replace"),
                      *_seal_parts(path, draw_id, scale))
    except OSError:
        return False


def live_release(draw_id: int, scale: str = LIVE_SCALE, progress: bool = True,
                 workers: int = 2, pin: dict | None = None) -> Path:
    """The release folder of live draw ``draw_id`` at ``scale``, built here if not cached.

    A cached folder is reused when :func:`cached_release` accepts it (one that does not is
    removed and rebuilt). Otherwise the draw is built (:func:`benchmark.build.family.build_draw`)
    into a temporary sibling folder, its lean causal reference computed and installed, the times
    written to ``live.json``, and the folder renamed into place in one step: an interrupted
    build leaves no cache entry (and removes its temporary folder; one left by a killed process
    is removed by the next build of that draw).

    Args:
        draw_id: the draw, an integer in ``[0, 2**31)``.
        scale: a family run scale (``"family"``, or ``"micro-family"`` in tests).
        progress: show tqdm progress bars.
        workers: replay processes for the causal reference.
        pin: ``{"redraw", "sft_checkpoint"}``: build that attempt from that post-SFT checkpoint
            (a season panel's draw, :func:`benchmark.build.family.build_draw`); a cached
            release is still taken as it is (the panel checks it).

    Returns:
        The release folder (``live_dir(draw_id, scale)``).

    Raises:
        BuildError: a bad id or scale, or every redraw of the draw failed its gates.
    """
    from benchmark.build.family import SCALES

    draw_id = check_draw_id(draw_id)
    if scale not in SCALES:
        raise BuildError(f"live draw scale {scale!r} is not a family scale; choose one of "
                         f"{sorted(SCALES)}")
    final = live_dir(draw_id, scale)
    hit = cached_release(draw_id, scale)
    if hit is not None:
        return hit
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(final)
    if final.exists():  # incomplete or corrupt (cached_release refused it): rebuild
        shutil.rmtree(final)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        timings = _build(draw_id, scale, tmp, progress, workers, pin)
        _json_dump(tmp / LIVE_FILE, timings)
        seal_draw(tmp, draw_id, scale)
        try:
            os.rename(tmp, final)
        except OSError:  # another process put the same draw in place first
            if cached_release(draw_id, scale) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _build(draw_id: int, scale: str, out: Path, progress: bool, workers: int,
           pin: dict | None = None) -> dict:
    """Build the draw and its lean reference into ``out``; return the phases' times (s)."""
    from tqdm import tqdm

    from benchmark.build.family import FAMILY_VERSION, build_draw
    from benchmark.causal.reference import install, reference
    from benchmark.releases.release import load_release

    bar = tqdm(total=3, desc=f"live draw {draw_id} ({scale})", disable=not progress, leave=False)
    t0 = time.perf_counter()
    manifest = build_draw(draw_id, out, scale=scale, progress=progress, pin=pin)
    t_build = time.perf_counter() - t0
    bar.update(1)
    rel = load_release(out)
    data, ref_seconds = {}, {}
    t1 = time.perf_counter()
    for s in rel.seeds:
        data[s] = reference(rel, s, workers=workers, progress=progress, verify_exact=False,
                            n_random=LIVE_N_RANDOM, lean=True)
        ref_seconds[str(s)] = data[s].pop("seconds")  # times stay out of the release's files
    t_ref = time.perf_counter() - t1
    bar.update(1)
    final = _deterministic_manifest(out, install(out, data))
    _move_store(out, rel.manifest_sha256, final)
    bar.update(1)
    bar.close()
    fam = manifest["build"]["family"]
    return {"draw_id": draw_id, "scale": scale, "family_version": FAMILY_VERSION,
            "redraws": fam["redraws"], "failed": fam["failed"], "n_random": LIVE_N_RANDOM,
            "build_seconds": round(t_build, 1),
            "build_phases_seconds": {s: v.get("timings_s") for s, v in
                                     manifest["seeds"].items()},
            "reference_seconds": round(t_ref, 1),
            "reference_replay_seconds": ref_seconds,
            "total_seconds": round(time.perf_counter() - t0, 1)}


def _deterministic_manifest(root: Path, manifest: dict) -> str:
    """Rewrite ``root``'s manifest without its times; return its sha256 (hex).

    Drops ``build.family.build_seconds`` and every seed's ``timings_s`` (``live.json`` keeps
    them), so two builds of one draw on one machine write the same bytes.
    """
    from benchmark.releases.format import MANIFEST, write_manifest

    build = dict(manifest["build"])
    build["family"] = {k: v for k, v in build["family"].items() if k != "build_seconds"}
    seeds = {int(s): {k: v for k, v in summ.items() if k != "timings_s"}
             for s, summ in manifest["seeds"].items()}
    write_manifest(root, manifest["release_id"], build, seeds,
                   version=manifest["release_version"])
    return hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()


def _move_store(root: Path, built_sha: str, final_sha: str) -> None:
    """Re-key the replays the reference made (under the built manifest) to the final manifest.

    The replay store is keyed by the manifest's sha256, which installing the reference changes;
    the run is the same, so its baseline and removals are the final release's too (an evaluation
    then starts from them instead of replaying the baseline again).
    """
    from benchmark.causal.replays import open_store

    src, dst = open_store(root, built_sha), open_store(root, final_sha)
    if src.dir.is_dir() and not dst.dir.exists():
        dst.adopt(src)


def _remove_stale(final: Path) -> None:
    """Remove temporary build folders of ``final`` whose building process no longer runs."""
    for p in final.parent.glob(f".{final.name}.tmp-*"):
        try:
            pid = int(p.name.rsplit(".tmp-", 1)[1].split("-")[0])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:  # another user's live process
            pass


def _json_dump(path: Path, obj: dict) -> None:
    from benchmark.io import atomic_write_text, dumps_json

    atomic_write_text(path, dumps_json(obj))


def live_timings(path: str | Path) -> dict:
    """The ``live.json`` of a live release folder (build and reference times), or {}."""
    p = Path(path) / LIVE_FILE
    return json.loads(p.read_text()) if p.is_file() else {}


# ----------------------------------------------------------------------------------------------
# scoring on a live draw


def draw_record(draw_id: int, results: dict, release_dir: str | Path) -> dict:
    """What the gate keeps of an evaluation on live draw ``draw_id``.

    ``{"draw_id", "trajectory_sha256", "release", "suite", "verdict"}``: the release block, the
    suite (causal scores with intervals and ``vs_random``), the overall verdict of ``results``,
    and the run's identity on every machine (:mod:`benchmark.build.trajectory`).
    """
    from benchmark.releases.release import MANIFEST

    manifest = json.loads((Path(release_dir) / MANIFEST).read_text())
    fam = manifest.get("build", {}).get("family") or {}
    return {"draw_id": int(draw_id), "trajectory_sha256": fam.get("trajectory_sha256"),
            "release": results["release"], "suite": results["suite"],
            "verdict": results["verdict"]}


def score_live(estimator_file: str | Path, draw_id: int, scale: str = LIVE_SCALE,
               progress: bool = True, isolation=None, env=None) -> dict:
    """Evaluate an estimator on live draw ``draw_id`` (built or found here); its draw record.

    ``isolation``/``env`` as in :func:`benchmark.evaluate.evaluate` (None isolation runs the
    estimator in this process: trusted code only).
    """
    from benchmark.evaluate import evaluate

    path = live_release(draw_id, scale, progress=progress)
    res = evaluate(estimator_file, path, progress=progress, isolation=isolation, env=env)
    return draw_record(draw_id, res, path)


# ----------------------------------------------------------------------------------------------
# the verify gate


def live_gate(public_suite: dict, live_suite: dict, est_name: str,
              tol: float) -> tuple[bool, str]:
    """Whether an entry's public claim survives a live draw (``bt-bench verify``'s check).

    Both suites carry ``vs_random = {"point", "lo", "hi"}``: the interval of the entry's suite
    causal score minus the random band's top, paired (:func:`benchmark.causal.score.band_margins`).
    The entry **fails** when its public score is significantly above the band (``lo > tol``), its
    live score is not (``lo <= tol``), and its live margin lies significantly below its public one
    (``live.hi + tol < public.lo``: it fell from its claim, not merely to the edge of the band).
    It passes otherwise: when both are above, when the public one is not (nothing is claimed),
    when the live margin is at the band but within reach of the public one (a weak method barely
    above the band on one run), and when either suite has no ``vs_random`` (no causal score
    there: nothing to compare; the reason says so).

    Args:
        public_suite: ``results["suite"]`` of the public evaluation.
        live_suite: ``results["suite"]`` of the evaluation on the live draw.
        est_name: the entry's estimator name (for the reason).
        tol: the cross-machine tolerance (``benchmark.causal.score.CROSS_MACHINE_TOLERANCE``).

    Returns:
        ``(ok, reason)``; the reason states both margins.
    """
    from benchmark.checklist import carry_over, signed_interval

    show = signed_interval

    pub, live = public_suite.get("vs_random"), live_suite.get("vs_random")
    if pub is None:
        return True, f"{est_name}: no public causal score against the random band; nothing claimed"
    case = carry_over(pub, live, tol)
    if case == "unchecked":
        return True, (f"{est_name}: the live draw gives no causal score (no bonus effect on any "
                      f"task); public margin {show(pub)} not checked")
    if case == "unclaimed":
        return True, (f"{est_name}: public score minus the random band {show(pub)} is not "
                      f"significantly above it (lower end <= {tol}); nothing claimed")
    if case == "above":
        return True, (f"{est_name}: above the random band on the public release {show(pub)} and "
                      f"on the live draw {show(live)}")
    if case == "at the reference":
        # at the band on the live draw, but not significantly below its public margin: a weak
        # method barely above the band on one run and at it on another is not caught lying
        return True, (f"{est_name}: not significantly above the random band on the live draw "
                      f"{show(live)}, but not significantly below its public margin {show(pub)} "
                      f"either (upper end + {tol} >= public lower end)")
    return False, (f"{est_name}: significantly above the random band on the public release "
                   f"(score minus band {show(pub)}) but not on the live draw ({show(live)}, lower "
                   f"end <= {tol}), and significantly below its public margin there (upper end "
                   f"+ {tol} < {pub['lo']:+.3f}): its public score does not carry over to a new "
                   "run")


def build_command(args) -> int:
    """``bt-bench live build ID [--scale S]``: build or find the draw; print folder and times."""
    scale = args.scale or LIVE_SCALE
    t0 = time.perf_counter()
    cached = cached_release(args.draw_id, scale) is not None
    path = live_release(args.draw_id, scale, progress=not args.no_progress, workers=args.workers)
    t = live_timings(path)
    print(f"live draw {args.draw_id} ({scale}, family {t.get('family_version')}): {path}")
    if cached:
        print(f"found in the cache ({time.perf_counter() - t0:.1f} s to verify); built in "
              f"{t.get('total_seconds')} s")
    else:
        phases = ", ".join(f"{k} {v:.1f}" for s in (t.get("build_phases_seconds") or {}).values()
                           for k, v in (s or {}).items())
        print(f"built in {t.get('total_seconds')} s: build {t.get('build_seconds')} s ({phases}; "
              f"{t.get('redraws')} redraw(s)), lean causal reference "
              f"{t.get('reference_seconds')} s")
    return 0
