"""The read side of a release: find it, verify it, open its seeds without labels.

A release folder holds ``manifest.json`` and one ``seed<S>/`` folder per seed (see
``docs/release_format.md``; the format itself is :mod:`benchmark.releases.format`).
:func:`load_release` verifies every checksum and returns a :class:`Release`; ``release.seed(S)``
is a :class:`SeedView` without labels, and ``release.labels(S)`` (or ``view.labels()``) reads the
separate label file.

Example:
    >>> rel = load_release("tiny")                      # doctest: +SKIP
    >>> view = rel.seed(0)                              # doctest: +SKIP
    >>> view.sketches.shape, view.rollouts.num_rows     # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmark.errors import ReleaseError
from benchmark.releases.format import LABEL_FILE, MANIFEST, SCHEMA_VERSION, verify_release
from benchmark.releases.registry import entry_for_manifest, find_entry, load_registry


def releases_dir() -> Path:
    """Folder of named releases: ``$BT_BENCH_RELEASES`` or ``<repo root>/releases``."""
    env = os.environ.get("BT_BENCH_RELEASES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "releases"


def resolve_release(name_or_path: str | os.PathLike, download: bool = True) -> Path:
    """Resolve a release name (``"tiny"``) or a folder path to the release folder.

    Order: a folder holding ``manifest.json``; ``releases_dir() / name`` (the shipped ``tiny``,
    or ``$BT_BENCH_RELEASES``); then, for an id in the release registry
    (:mod:`benchmark.releases.registry`), its pinned revision in the Hugging Face cache,
    downloaded first (:mod:`benchmark.releases.hub`) when it is not cached and ``download`` is
    true (never with ``HF_HUB_OFFLINE=1``). The folder is returned as an absolute path (the
    estimator's sandbox runs in another working directory).

    Raises:
        ReleaseError: nothing found (the message says where it looked and how to get it).
    """
    p = Path(name_or_path)
    if (p / MANIFEST).is_file():
        return Path(os.path.abspath(p))  # absolute: the estimator's sandbox runs elsewhere
    cand = releases_dir() / str(name_or_path)
    if (cand / MANIFEST).is_file():
        return Path(os.path.abspath(cand))
    from benchmark.releases import hub

    entry = find_entry(str(name_or_path))
    if entry is not None:
        hit = hub.cached_release(entry.release_id)
        if hit is not None:
            return hit
        if download:
            return hub.release_from_hub(entry.release_id)
    hint = (f"run `bt-bench download {name_or_path}`" if entry is not None else
            f"registered ids: {sorted(load_registry())}")
    raise ReleaseError(
        f"no release {str(name_or_path)!r}: neither {p} nor {cand} holds {MANIFEST} and it is not "
        f"in the Hugging Face cache; pass a release folder, set BT_BENCH_RELEASES to the folder "
        f"that contains it, or {hint}"
    )


@dataclass
class SeedView:
    """One seed of a release without its labels (the files an evaluator builds views from).

    Attributes:
        seed: the seed number.
        path: the seed folder.
        config: the build config (dict), with ``behaviors`` (one per task).
        sketches: memory-mapped array ``(n_nonzero, dim)`` (float16 or float32) of stored values;
            true sketch = stored / ``sketch_scale``; ``sketch_row`` of the rollouts table indexes it
            (-1: an all-zero gradient, not stored).
        sketch_scale: the power-of-two scale the stored values carry.
        sketch_meta: hash method, dim, seed, n_params, the parameter layout and draw scales.
        curve: ``pandas.DataFrame`` of the behavior-rate curve (columns in release_format.md).
        checkpoints: dict step -> checkpoint folder (``AutoModelForCausalLM.from_pretrained``).
        tokenizer_path: tokenizer folder (``AutoTokenizer.from_pretrained``).
    """

    seed: int
    path: Path
    config: dict
    sketches: np.ndarray
    sketch_scale: float
    sketch_meta: dict
    curve: object
    checkpoints: dict
    tokenizer_path: Path

    @property
    def tasks(self) -> list[str]:
        """The task (behavior) ids of the run, in build order."""
        return [b["id"] for b in self.config["behaviors"]]

    def behavior(self, task: str) -> dict:
        """The build config of one behavior (id, trigger word, token, bonus, window, ...)."""
        for b in self.config["behaviors"]:
            if b["id"] == task:
                return b
        raise ReleaseError(f"seed {self.seed} has no task {task!r}; tasks: {self.tasks}")

    def table(self, columns: list[str] | None = None):
        """The rollouts table as a ``pandas.DataFrame`` (rollout order: step-major)."""
        import pandas as pd

        return pd.read_parquet(self.path / "rollouts.parquet", columns=columns)

    @property
    def rollouts(self):
        """The rollouts table as a ``datasets.Dataset`` (as ``load_dataset`` reads it)."""
        import datasets
        from datasets.utils.logging import (
            disable_progress_bar,
            enable_progress_bar,
            is_progress_bar_enabled,
        )

        shown = is_progress_bar_enabled()
        disable_progress_bar()  # one bar per seed load is noise
        try:
            return datasets.load_dataset("parquet", data_files=str(self.path / "rollouts.parquet"),
                                         split="train")
        finally:
            if shown:
                enable_progress_bar()

    def targets(self, task: str) -> dict[str, np.ndarray]:
        """Name -> float32 ``(dim,)`` sketched targets of ``task``: ``{kind}_step{SSSS}``."""
        self.behavior(task)
        with np.load(self.path / "targets" / f"{task}.npz", allow_pickle=False) as z:
            return {k: z[k].astype(np.float32) for k in z.files}

    def draws(self, task: str) -> list[dict]:
        """The generation draws of ``task`` (sketches memory-mapped).

        Dicts ``{"id", "step", "draw", "table", "sketches", "sketch_scale", "token_sketches",
        "token_scale"}``.
        """
        import pandas as pd

        self.behavior(task)
        scales = self.sketch_meta.get("draw_scales", {})
        out = []
        for pq in sorted((self.path / "draws" / task).glob("*.parquet")):
            stem = pq.name[: -len(".parquet")]
            step_s, draw_s = stem.split("_")
            out.append({
                "id": f"{task}/{stem}", "step": int(step_s[4:]), "draw": int(draw_s[4:]),
                "table": pd.read_parquet(pq),
                "sketches": np.load(pq.with_name(stem + "_sketches.npy"), mmap_mode="r",
                                    allow_pickle=False),
                "sketch_scale": float(scales.get(f"{task}/{stem}_sketches", 1.0)),
                "token_sketches": np.load(pq.with_name(stem + "_token_sketches.npy"),
                                          mmap_mode="r", allow_pickle=False),
                "token_scale": float(scales.get(f"{task}/{stem}_token_sketches", 1.0)),
            })
        return out

    def sketch_rows(self, rows) -> np.ndarray:
        """Float32 true sketches of ``rows`` (indices into ``sketches``), shape ``(len, dim)``."""
        return np.asarray(self.sketches[rows], dtype=np.float32) / np.float32(self.sketch_scale)


@dataclass
class Release:
    """A verified release: ``seeds`` lists the seed numbers; ``seed(S)`` is the label-free view.

    ``manifest_sha256`` is the sha256 of ``manifest.json``. ``hub_repo_id`` / ``hub_revision``
    name the Hub dataset commit whose files this folder holds byte for byte: the snapshot's
    commit for a copy in the Hugging Face cache, else the registry's pinned revision when the
    manifest sha256 matches the registry (the shipped ``tiny`` once it is pushed); ``None`` for
    an unpublished release.
    """

    path: Path
    manifest: dict
    seeds: list[int]
    manifest_sha256: str | None = None
    hub_repo_id: str | None = None
    hub_revision: str | None = None

    @property
    def release_id(self) -> str:
        """The release id from the manifest (e.g. ``"tiny"``)."""
        return self.manifest["release_id"]

    def seed(self, seed: int) -> SeedView:
        """Return the label-free view of ``seed``."""
        if seed not in self.seeds:
            raise ReleaseError(f"seed {seed} is not in release {self.release_id}; "
                               f"available: {self.seeds}")
        return _load_seed_view(self.path / f"seed{seed}", seed)

    @property
    def tasks(self) -> list[str]:
        """The task (behavior) ids of the release, in build order."""
        return [b["id"] for b in self.manifest["build"]["config"]["behaviors"]]

    def labels(self, seed: int):
        """Return the labels of ``seed`` (pandas DataFrame), never part of the estimator view.

        Columns: rollout_id, step, group, and per task T: bonus_T, eligible_T, group_label_T,
        step_label_T.
        """
        import pandas as pd

        if seed not in self.seeds:
            raise ReleaseError(f"seed {seed} is not in release {self.release_id}; "
                               f"available: {self.seeds}")
        return pd.read_parquet(self.path / f"seed{seed}" / LABEL_FILE)


def _load_seed_view(d: Path, seed: int) -> SeedView:
    import pandas as pd

    config = json.loads((d / "config.json").read_text())
    meta = json.loads((d / "sketch.json").read_text())
    ckpts = {int(p.name[4:]): p for p in sorted((d / "checkpoints").glob("step*"))}
    return SeedView(
        seed=seed, path=d, config=config,
        sketches=np.load(d / "sketches.npy", mmap_mode="r", allow_pickle=False),
        sketch_scale=float(meta["scale"]),
        sketch_meta=meta, curve=pd.read_parquet(d / "behavior_curve.parquet"), checkpoints=ckpts,
        tokenizer_path=d / "tokenizer",
    )


def load_release(name_or_path: str | os.PathLike, verify: bool = True) -> Release:
    """Open a release by name (``"tiny"``) or folder; verify sha256 of every file by default.

    Raises:
        ReleaseError: the release is not found, has another schema version, or a file is
            missing or modified (the message names the file, the expected and actual sha256).
    """
    root = resolve_release(name_or_path)
    raw = (root / MANIFEST).read_bytes()
    manifest = json.loads(raw)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ReleaseError(
            f"{root / MANIFEST} has schema_version {manifest.get('schema_version')!r}, this "
            f"bt-bench reads {SCHEMA_VERSION}; upgrade bt-bench or fetch a matching release (a "
            "schema-1 release such as tiny 1.0.0 is read by bt-bench 0.1, in git history)"
        )
    from benchmark.releases import hub

    msha = hashlib.sha256(raw).hexdigest()
    origin = hub.hub_origin(root)
    if verify:
        try:
            verify_release(root, manifest)
        except ReleaseError as e:
            if origin is None:
                raise
            raise ReleaseError(f"{e}. This copy is in the Hugging Face cache ({origin[0]} at "
                               f"{origin[1]}): `bt-bench download {manifest.get('release_id')} "
                               f"--revision {origin[1]}` fetches the failing files again") from e
    if origin is None:
        entry = entry_for_manifest(str(manifest.get("release_id")), msha)
        if entry is not None and entry.revision is not None:
            origin = (entry.repo_id, entry.revision)
    seeds = sorted(int(s) for s in manifest["seeds"])
    return Release(path=root, manifest=manifest, seeds=seeds, manifest_sha256=msha,
                   hub_repo_id=origin[0] if origin else None,
                   hub_revision=origin[1] if origin else None)
