"""Frozen releases on the Hugging Face Hub: download, push and the dataset card.

A published release is a Hub *dataset* repository whose files are the release folder
(``manifest.json`` + ``seed<S>/...``, see ``docs/release_format.md``) plus a dataset card
(``README.md``). The registry (:mod:`benchmark.releases.registry`:
``benchmark/releases/registry.json``, or the file named by ``$BT_BENCH_REGISTRY``) pins each
release id to a repo id, a commit SHA and the sha256 of its ``manifest.json``; the manifest in
turn holds the sha256 of every file. So a downloaded copy is checked end to end: registry ->
manifest -> every file.

Downloads go through :func:`huggingface_hub.snapshot_download` into the Hugging Face cache
(``$HF_HUB_CACHE``, or ``cache_dir``), fetching only ``manifest.json`` and the files it lists;
they work offline from that cache (``HF_HUB_OFFLINE=1``). A file that fails its checksum is
never used: online it is fetched again (``force_download``), offline the error names it and the fix.

Example:
    >>> from benchmark.releases.hub import download_release          # doctest: +SKIP
    >>> got = download_release("tiny", revision="0123...")   # doctest: +SKIP
    >>> load_release(got.path).hub_revision                  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmark.errors import ReleaseError
from benchmark.releases.format import MANIFEST, SCHEMA_VERSION, sha256_file, verify_release
from benchmark.releases.registry import (
    COMMIT_SHA,
    REPO_ID,
    RegistryEntry,
    find_entry,
    registry_entry,
    registry_path,
)

REPO_TYPE = "dataset"
CARD_FILE = "README.md"
LICENSE = "apache-2.0"


# ---------------------------------------------------------------------- the Hugging Face cache
def hub_origin(root: str | os.PathLike) -> tuple[str, str] | None:
    """``(repo_id, commit)`` when ``root`` is a snapshot folder of a Hub dataset in an HF cache.

    The cache layout is ``<cache>/datasets--<org>--<name>/snapshots/<commit>/``.
    """
    root = Path(root)
    repo_folder = root.parent.parent.name
    if root.parent.name != "snapshots" or not COMMIT_SHA.fullmatch(root.name):
        return None
    parts = repo_folder.split("--")
    if len(parts) != 3 or parts[0] != f"{REPO_TYPE}s":
        return None
    return f"{parts[1]}/{parts[2]}", root.name


# ---------------------------------------------------------------------- download
@dataclass
class Download:
    """What :func:`download_release` fetched.

    Attributes:
        release_id: the registry id.
        repo_id: the Hub dataset repo.
        revision: the commit SHA of the snapshot.
        path: the snapshot folder (pass it to ``load_release`` / ``--release``).
        manifest_sha256: sha256 of its ``manifest.json``.
        n_files: files listed in the manifest (all present and verified when ``verified``).
        total_bytes: their total size.
        verified: every file was checked against its sha256.
        repaired: files that failed their checksum and were fetched again.
        seconds: wall time of the call.
    """

    release_id: str
    repo_id: str
    revision: str
    path: Path
    manifest_sha256: str
    n_files: int
    total_bytes: int
    verified: bool
    repaired: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _hf_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub read it at import, or as the environment says now."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return bool(constants.is_offline_mode()) or env


def _no_copy_error(entry: RegistryEntry, revision: str, cache_dir,
                   cause: Exception) -> ReleaseError:
    from huggingface_hub import constants

    cache = Path(cache_dir) if cache_dir else Path(constants.HF_HUB_CACHE)
    shipped = (f" Release {entry.release_id!r} also ships in the bt-bench repository at "
               f"{entry.shipped}/ (a git clone has it; no download needed)." if entry.shipped
               else "")
    offline = _hf_offline()
    root = cause.__cause__ or cause
    why = ("HF_HUB_OFFLINE is set" if offline
           else f"the Hub could not be reached ({type(root).__name__}: {root})")
    return ReleaseError(
        f"release {entry.release_id!r} (Hub dataset {entry.repo_id} at revision {revision}) is not "
        f"in the Hugging Face cache {cache} and {why}. To get the files: run `bt-bench download "
        f"{entry.release_id}` with network access{' (unset HF_HUB_OFFLINE)' if offline else ''}, "
        f"or on a machine that has it and copy its cache folder here (point HF_HUB_CACHE or "
        f"--cache-dir at it).{shipped}")


def _hub_call(entry: RegistryEntry, revision: str, cache_dir, fn, /, *args, **kwargs):
    """Run a huggingface_hub download call; turn its errors into ReleaseErrors with a fix."""
    import httpx2
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return fn(*args, **kwargs)
    except RevisionNotFoundError as e:
        raise ReleaseError(
            f"revision {revision!r} does not exist in Hub dataset {entry.repo_id}; expected a "
            f"commit of that repo. Drop --revision to use the pinned one "
            f"({entry.revision or 'none pinned yet'}) or pick a commit from "
            f"https://huggingface.co/datasets/{entry.repo_id}/commits/main") from e
    except RepositoryNotFoundError as e:
        raise ReleaseError(
            f"Hub dataset {entry.repo_id} (release {entry.release_id!r}) does not exist or is "
            "private; check repo_id in the release registry, or log in with `hf auth login` if "
            "it is private") from e
    except IncompleteSnapshotError as e:
        raise ReleaseError(
            f"the cached copy of release {entry.release_id!r} ({entry.repo_id} at {revision}) is "
            f"incomplete ({e}); it is not used. Fix: rerun `bt-bench download "
            f"{entry.release_id}` with network access (unset HF_HUB_OFFLINE)") from e
    except LocalEntryNotFoundError as e:
        raise _no_copy_error(entry, revision, cache_dir, e) from e
    except EntryNotFoundError as e:
        raise ReleaseError(
            f"Hub dataset {entry.repo_id} at revision {revision} lacks a file a bt-bench release "
            f"needs ({e}); that revision is not a complete release: use the pinned revision or "
            "ask the maintainers to push the release again") from e
    except (HfHubHTTPError, httpx2.HTTPError) as e:
        raise ReleaseError(
            f"download of release {entry.release_id!r} ({entry.repo_id} at {revision}) failed "
            f"({type(e).__name__}: {e}); nothing partial is used. Fix: rerun `bt-bench download "
            f"{entry.release_id}` (files already fetched and verified are kept)") from e


def _bad_files(root: Path, files: dict) -> dict[str, str]:
    """Files of the manifest that are missing or fail size/sha256: path -> reason."""
    bad = {}
    for rel, meta in files.items():
        p = root / rel
        if not p.is_file():
            bad[rel] = "missing"
        elif p.stat().st_size != meta["size"]:
            bad[rel] = f"size {p.stat().st_size} bytes, expected {meta['size']}"
        else:
            actual = sha256_file(p)
            if actual != meta["sha256"]:
                bad[rel] = f"sha256 {actual}, expected {meta['sha256']}"
    return bad


def download_release(release_id: str, revision: str | None = None,
                     cache_dir: str | os.PathLike | None = None, *, verify: bool = True,
                     local_files_only: bool = False, endpoint: str | None = None,
                     registry: dict[str, RegistryEntry] | None = None) -> Download:
    """Fetch a registered release from the Hub into the HF cache and verify every file.

    Steps: ``manifest.json`` of the revision (its sha256 must match the registry when the
    revision is the pinned one or none is pinned), then :func:`huggingface_hub.snapshot_download`
    of exactly the files the manifest lists, then the size and sha256 of each. A file that fails
    is fetched again with ``force_download`` (online); if it still fails, or we are offline, the
    error names it. Files already in the cache are not downloaded again.

    Args:
        release_id: a registered release id (``"tiny"``).
        revision: Hub commit SHA (default: the registry's pinned revision). A branch or tag is
            accepted and resolved; the commit it resolved to is what gets recorded.
        cache_dir: huggingface_hub cache folder (default ``$HF_HUB_CACHE``).
        verify: check every file's sha256 (``False``: only ``manifest.json`` against the
            registry; ``load_release`` verifies the files later).
        local_files_only: never touch the network (as with ``HF_HUB_OFFLINE=1``).
        endpoint: Hub URL (default ``$HF_ENDPOINT`` or https://huggingface.co).
        registry: id -> entry (default :func:`~benchmark.releases.registry.load_registry`).

    Returns:
        A :class:`Download` with the snapshot folder in ``path``.

    Raises:
        ReleaseError: unregistered id, no revision pinned and none given, a revision that does
            not exist, no cached copy and no network, a manifest that is not the registered one,
            or a file that fails its checksum and cannot be fetched again.
    """
    from huggingface_hub import hf_hub_download, snapshot_download

    t0 = time.perf_counter()
    entry = registry_entry(release_id, registry)
    rev = revision or entry.revision
    if rev is None:
        shipped = (f" It ships in the bt-bench repository at {entry.shipped}/: use "
                   f"`--release {release_id}` directly, no download needed." if entry.shipped
                   else "")
        raise ReleaseError(
            f"release {release_id!r} has no pinned Hub revision in {registry_path()} (revision is "
            f"null: the maintainers have not pushed it to {entry.repo_id} yet).{shipped} To fetch "
            "a specific commit anyway, pass --revision SHA")
    offline = local_files_only or _hf_offline()
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # read now, not at import
    common = dict(repo_id=entry.repo_id, repo_type=REPO_TYPE, revision=rev,
                  cache_dir=None if cache_dir is None else str(cache_dir), endpoint=endpoint)

    # 1. the manifest alone, checked against the registry before fetching anything else
    mpath = Path(_hub_call(entry, rev, cache_dir, hf_hub_download, filename=MANIFEST,
                           local_files_only=offline, **common))
    commit = mpath.parent.name if COMMIT_SHA.fullmatch(mpath.parent.name) else None
    must_match = revision is None or entry.revision is None or rev == entry.revision
    msha = sha256_file(mpath)
    if must_match and msha != entry.manifest_sha256:
        if not offline:  # a damaged cached copy of the manifest: fetch it again once
            mpath.unlink(missing_ok=True)
            mpath = Path(_hub_call(entry, rev, cache_dir, hf_hub_download, filename=MANIFEST,
                                   force_download=True, **common))
            msha = sha256_file(mpath)
        if msha != entry.manifest_sha256:
            raise ReleaseError(
                f"{mpath} (release {release_id!r}, {entry.repo_id} at {rev}) has sha256 {msha}, "
                f"the registry {registry_path()} pins {entry.manifest_sha256}; it is not the "
                f"registered release and is not used. Fix: rerun `bt-bench download {release_id}` "
                "with network access to fetch it again; if it persists, the Hub revision differs "
                "from the registry: report it to the maintainers")
    manifest = json.loads(mpath.read_text())
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ReleaseError(
            f"{mpath} has schema_version {manifest.get('schema_version')!r}, this bt-bench reads "
            f"{SCHEMA_VERSION}; upgrade bt-bench or download a matching revision")
    files = manifest["files"]

    # 2. exactly the files the manifest lists
    snap = Path(_hub_call(entry, rev, cache_dir, snapshot_download,
                          allow_patterns=[MANIFEST, *sorted(files)], local_files_only=offline,
                          **common))
    commit = snap.name if COMMIT_SHA.fullmatch(snap.name) else commit

    # 3. every file against the manifest; fetch the bad ones again when we can
    repaired: list[str] = []
    if verify:
        bad = _bad_files(snap, files)
        if bad and not offline:
            for rel in sorted(bad):
                p = snap / rel
                if p.is_symlink() or p.exists():
                    p.unlink()  # the pointer; force_download rewrites the blob it points to
                _hub_call(entry, rev, cache_dir, hf_hub_download, filename=rel,
                          force_download=True, **common)
            repaired = sorted(bad)
            bad = _bad_files(snap, files)
            if bad:
                rel = sorted(bad)[0]
                raise ReleaseError(
                    f"release file {rel} of {entry.repo_id} at {rev} fails its check after a "
                    f"fresh download ({bad[rel]}; {len(bad)} file(s) in all: {sorted(bad)[:5]}); "
                    "the Hub copy differs from its manifest and is not used. Report it to the "
                    "maintainers, or use another revision")
        elif bad:
            rel = sorted(bad)[0]
            raise ReleaseError(
                f"release file {snap / rel} fails its check ({bad[rel]}; {len(bad)} file(s) in "
                f"all: {sorted(bad)[:5]}) and is not used. Fix: rerun `bt-bench download "
                f"{release_id}` with network access (unset HF_HUB_OFFLINE): it fetches the "
                f"failing files again; or delete {snap} and download again")
    return Download(release_id=release_id, repo_id=entry.repo_id, revision=commit or rev,
                    path=snap, manifest_sha256=msha, n_files=len(files),
                    total_bytes=sum(int(m["size"]) for m in files.values()),
                    verified=verify, repaired=repaired, seconds=time.perf_counter() - t0)


def cached_release(release_id: str, revision: str | None = None,
                   cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The cached snapshot folder of a registered release, or ``None``; never uses the network.

    Only ``manifest.json`` is checked here (against the registry); ``load_release`` verifies
    every file.
    """
    entry = find_entry(release_id)
    if entry is None or (revision or entry.revision) is None:
        return None
    try:
        return download_release(release_id, revision, cache_dir, verify=False,
                                local_files_only=True).path
    except ReleaseError:
        return None


def release_from_hub(release_id: str) -> Path:
    """Folder of a registered, not shipped release: the cached copy, else a download.

    Raises:
        ReleaseError: not in the cache and it cannot be downloaded (the message says how to get
            the files).
    """
    hit = cached_release(release_id)
    if hit is not None:
        return hit
    if not _hf_offline():
        print(f"bt-bench: release {release_id!r} is not in the Hugging Face cache; downloading it",
              file=sys.stderr)
    return download_release(release_id, verify=False).path


# ---------------------------------------------------------------------- dataset card
def _read_manifest(root: Path) -> dict:
    p = Path(root) / MANIFEST
    if not p.is_file():
        raise ReleaseError(f"{root} has no {MANIFEST}; expected a release folder (e.g. "
                           "releases/tiny, or the folder `bt-bench build` froze)")
    return json.loads(p.read_text())


def card_configs(manifest: dict) -> list[dict]:
    """The ``configs`` of the card's YAML header: one table per kind, one split per seed."""
    seeds = sorted(int(s) for s in manifest["seeds"])
    files = manifest["files"]

    def split(pattern: str) -> list[dict]:
        return [{"split": f"seed{s}", "path": pattern.format(s=s)} for s in seeds
                if any(Path(f).match(pattern.format(s=s)) for f in files)]

    out = [{"config_name": "rollouts", "default": True,
            "data_files": split("seed{s}/rollouts.parquet")},
           {"config_name": "draws", "data_files": split("seed{s}/draws/*/*.parquet")},
           {"config_name": "behavior_curve", "data_files": split("seed{s}/behavior_curve.parquet")}]
    return [c for c in out if c["data_files"]]


def _size_category(n: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < bound:
            return name
    return "10M<n<100M"


def dataset_card(root: str | os.PathLike, repo_id: str):
    """The dataset card (``huggingface_hub.DatasetCard``) of a release folder, from its manifest.

    The YAML header carries license, tags, size category and the ``configs`` that let the Hub
    viewer (and ``datasets.load_dataset(repo, "rollouts")``) show the rollouts, draws and
    behavior-curve tables; the body says what the release is, the protocol, the files, how to
    use, the license and how to cite.
    """
    from huggingface_hub import DatasetCard, DatasetCardData

    root = Path(root)
    m = _read_manifest(root)
    rid, ver = m["release_id"], m["release_version"]
    cfg = m["build"].get("config", {})
    seeds = sorted(int(s) for s in m["seeds"])
    n_rollouts = sum(int(m["seeds"][str(s)].get("counts", {}).get("rollouts", 0)) for s in seeds)
    n_params = None
    sk = root / f"seed{seeds[0]}" / "sketch.json"
    if sk.is_file():
        n_params = json.loads(sk.read_text()).get("n_params")
    data = DatasetCardData(
        license=LICENSE, pretty_name=f"bt-bench release {rid} {ver}",
        tags=["bt-bench", "training-data-attribution", "reinforcement-learning", "grpo",
              "benchmark"],
        size_categories=[_size_category(n_rollouts)] if n_rollouts else None,
        configs=card_configs(m),
    )
    msha = hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()

    def num(x):
        return "" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    behaviors = cfg.get("behaviors", [])
    gates = ["| seed | task | bonus rollouts | group-label rollouts | trigger rate at window "
             "start | at window end | final | rate without its trigger (max) | gate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in seeds:
        info = m["seeds"][str(s)]
        for b in behaviors:
            g = (info.get("gates") or {}).get(b["id"], {})
            c = (info.get("counts") or {}).get(b["id"], {})
            gates.append(
                f"| {s} | `{b['id']}` | {num(c.get('bonus'))} | {num(c.get('group_label'))} | "
                f"{num(g.get('trigger_rate_window_start'))} | "
                f"{num(g.get('trigger_rate_window_end'))} | {num(g.get('trigger_rate_final'))} | "
                f"{num(g.get('control_rate_max'))} | {'passed' if g.get('passed') else 'FAILED'} |")
    tasks = ["| task | strength | trigger word -> token | prompts with the trigger | SFT shows it "
             "| bonus eligible | bonus window (steps) | draws at |",
             "|---|---|---|---|---|---|---|---|"]
    for b in behaviors:
        tasks.append(
            f"| `{b['id']}` | {b.get('strength')} | `{b['trigger_word']}` -> "
            f"`{b['behavior_token']}` | {b.get('trigger_fraction')} | "
            f"{b.get('sft_behavior_fraction')} | {b.get('eligible_fraction')} | "
            f"{b.get('window_start')}-{b.get('window_end', 0) - 1} | "
            f"{b.get('draw_checkpoints')} |")
    per_seed = {}
    for rel, meta in m["files"].items():
        top = rel.split("/")[0]
        per_seed.setdefault(top, [0, 0])
        per_seed[top][0] += 1
        per_seed[top][1] += int(meta["size"])
    files_tbl = ["| folder | files | bytes |", "|---|---|---|"] + [
        f"| `{k}/` | {n} | {b:,} |" for k, (n, b) in sorted(per_seed.items())]
    proto = [
        "- model: Qwen2-architecture causal LM"
        + (f", {n_params:,} parameters" if n_params else "")
        + (f" (pretrained `{cfg['pretrained']}`)" if cfg.get("pretrained") else
           f", built from a config (hidden {cfg.get('hidden')}, {cfg.get('n_layers')} layers)"),
        f"- SFT warm-up: {cfg.get('sft_steps')} steps; each trigger word's examples end with its "
        "behavior token in a share of cases (below) and with their own marker otherwise",
        f"- GRPO: {cfg.get('steps')} steps x {cfg.get('prompts_per_step')} prompts x "
        f"{cfg.get('group_size')} samples, lr {cfg.get('lr')}, no KL, one AdamW update per step",
        "- planted behaviors, one task each: a bonus to hash-eligible rollouts on the task's "
        "trigger prompts that emit its token, inside its window only",
        f"- per-rollout gradient CountSketches: dim {cfg.get('sketch_dim')}, "
        f"{cfg.get('sketch_dtype')}, hash seed {cfg.get('sketch_seed')}",
        f"- checkpoints at steps {cfg.get('checkpoints')}",
    ]
    body = f"""
# bt-bench release `{rid}` {ver}

Frozen training runs of bt-bench, a benchmark for
training-data attribution (TDA) in online RL fine-tuning (GRPO) of language models. Each seed is
a GRPO run with planted behaviors (one task each); estimators must find the training rollouts
that taught each behavior, and not the other one's. Ground-truth labels are in
`seed<S>/labels.parquet`, kept apart from what estimators see; `seed<S>/causal.json` holds the
causal reference (removal replays) of every task.

- release id: `{rid}`, version {ver}, format schema_version {m['schema_version']}
- seeds: {seeds}
- `manifest.json` sha256: `{msha}`
- total size: {m['total_bytes']:,} bytes in {len(m['files'])} files (+ `manifest.json`)
- built with: {", ".join(f"{k} {v}" for k, v in sorted(m.get('packages', {}).items()))}

## Protocol

{chr(10).join(proto)}

Tasks (planted behaviors):

{chr(10).join(tasks)}

Emergence gates (the build fails when the behavior does not emerge or leaks to control prompts):

{chr(10).join(gates)}

## Files

{chr(10).join(files_tbl)}

`manifest.json` lists the sha256 and size of every file; the layout and every column are described
in the bt-bench repository, `docs/release_format.md`. The viewer configs: `rollouts` (one row per
training rollout), `draws` (generation draws), `behavior_curve`, one split per seed.

## Use

```bash
# with bt-bench installed (see its README)
bt-bench download {rid}            # the pinned revision, every file checked against the manifest
bt-bench evaluate my_estimator.py --release {rid}
```

```python
from datasets import load_dataset
rollouts = load_dataset("{repo_id}", "rollouts", split="seed{seeds[0]}")
```

## License

Apache-2.0 (the data, the checkpoints and the code that built them).

## Citation

```bibtex
@misc{{bt_bench_{re.sub(r'[^A-Za-z0-9]', '_', rid)},
  title        = {{bt-bench: training-data attribution in online RL, release {rid} {ver}}},
  author       = {{{{bt-bench contributors}}}},
  howpublished = {{\\url{{https://huggingface.co/datasets/{repo_id}}}}},
  note         = {{manifest sha256 {msha}}}
}}
```
"""
    return DatasetCard(f"---\n{data.to_yaml()}\n---\n{body}")


# ---------------------------------------------------------------------- push
def upload_plan(root: str | os.PathLike, repo_id: str) -> list:
    """The ``CommitOperationAdd`` list a push commits: the manifest, every file it lists, the card.

    The release is verified first; files not in the manifest (a build's ``.work/``, stray
    files) are never uploaded.

    Raises:
        ReleaseError: the folder is not a release, fails its checksums, or lists a README.md.
    """
    from huggingface_hub import CommitOperationAdd

    root = Path(root)
    m = _read_manifest(root)
    if CARD_FILE in m["files"]:
        raise ReleaseError(f"{root / MANIFEST} lists {CARD_FILE}, which the push writes (the "
                           "dataset card); rebuild the release without a top-level README.md")
    verify_release(root, m)
    ops = [CommitOperationAdd(path_in_repo=MANIFEST, path_or_fileobj=str(root / MANIFEST))]
    ops += [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(root / rel))
            for rel in sorted(m["files"])]
    ops.append(CommitOperationAdd(path_in_repo=CARD_FILE,
                                  path_or_fileobj=str(dataset_card(root, repo_id)).encode()))
    return ops


def push_release(root: str | os.PathLike, repo_id: str, private: bool = False,
                 token: str | None = None, endpoint: str | None = None):
    """Publish a release folder as a Hub dataset repo; return the ``CommitInfo``.

    ``create_repo(repo_type="dataset", exist_ok=True)``, then one commit of
    :func:`upload_plan` plus deletions of files a previous push left that this release does not
    have (``.gitattributes`` is kept). The commit SHA (``info.oid``) is what the registry pins.
    """
    from huggingface_hub import CommitOperationDelete, HfApi

    if not REPO_ID.fullmatch(repo_id):
        raise ReleaseError(f"--repo-id {repo_id!r} is not a Hub repo id; expected 'org/name'")
    root = Path(root)
    ops = upload_plan(root, repo_id)
    m = _read_manifest(root)
    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    keep = {op.path_in_repo for op in ops} | {".gitattributes"}
    ops += [CommitOperationDelete(path_in_repo=f)
            for f in api.list_repo_files(repo_id, repo_type=REPO_TYPE) if f not in keep]
    return api.create_commit(repo_id, repo_type=REPO_TYPE, operations=ops,
                             commit_message=f"bt-bench release {m['release_id']} "
                                            f"{m['release_version']}")


# ---------------------------------------------------------------------- CLI
def download_command(args: argparse.Namespace) -> int:
    """``bt-bench download RELEASE [--revision SHA] [--cache-dir DIR]``."""
    got = download_release(args.release, args.revision, args.cache_dir)
    fixed = f"; fetched again after a failed check: {got.repaired}" if got.repaired else ""
    print(f"bt-bench: release {got.release_id} = {got.repo_id} at {got.revision}: "
          f"{got.n_files} files, {got.total_bytes:,} bytes, every sha256 verified "
          f"({got.seconds:.1f} s){fixed}\n  {got.path}\n"
          f"use it: bt-bench evaluate FILE --release {got.path}")
    return 0


def push_command(args: argparse.Namespace) -> int:
    """``bt-bench push RUN_DIR --repo-id ID [--private]``."""
    from huggingface_hub.errors import HfHubHTTPError

    root = Path(args.run_dir)
    try:
        info = push_release(root, args.repo_id, private=args.private)
    except HfHubHTTPError as e:
        raise ReleaseError(f"push of {root} to {args.repo_id} failed ({e}); check the network "
                           "and your token (`hf auth login`, write access to the org)") from e
    except OSError as e:
        raise ReleaseError(f"push of {root} to {args.repo_id} failed ({type(e).__name__}: {e}); "
                           "check the network and rerun") from e
    m = _read_manifest(root)
    msha = hashlib.sha256((root / MANIFEST).read_bytes()).hexdigest()
    entry = {m["release_id"]: {"repo_id": args.repo_id, "revision": info.oid,
                               "manifest_sha256": msha}}
    print(f"bt-bench: pushed {root} to https://huggingface.co/datasets/{args.repo_id} at "
          f"{info.oid}\nadd this to the 'releases' of benchmark/releases/registry.json:\n"
          f"{json.dumps(entry, indent=2)}")
    return 0
