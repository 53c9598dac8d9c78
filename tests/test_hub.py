"""Hub path of releases: registry, download + verify, offline cache, repair, card, push plan.

No network: a small HTTP server on 127.0.0.1 serves local folders through the endpoints the
real ``huggingface_hub`` download code calls (``/api/datasets/<repo>/revision|tree/<rev>``,
``HEAD``/``GET /datasets/<repo>/resolve/<rev>/<path>``, errors flagged with ``X-Error-Code`` as
the Hub does). Everything on the client side is the real ``snapshot_download`` /
``hf_hub_download`` writing the real cache layout (``datasets--org--name/{blobs,snapshots,refs}``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from benchmark.errors import ReleaseError
from benchmark.releases import hub
from benchmark.releases.registry import REGISTRY_FILE, load_registry
from benchmark.releases.release import MANIFEST, load_release, resolve_release

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "releases" / "tiny"
REPO = "bt-bench/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a fake pinned revision
OTHER = "fedcba9876543210fedcba9876543210fedcba98"  # a commit the fake Hub does not have


# ---------------------------------------------------------------------- a local Hub
class FakeHub:
    """Dataset repos served from local folders: repo -> {commit: folder}, refs -> commit."""

    def __init__(self):
        self.repos: dict[str, dict[str, Path]] = {}
        self.refs: dict[str, dict[str, str]] = {}
        self.etags: dict[tuple[str, str, str], str] = {}
        self.log: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                outer._handle(self, body=False)

            def do_GET(self):
                outer._handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: str, commit: str, folder: Path, branch: str = "main") -> None:
        self.repos.setdefault(repo, {})[commit] = folder
        self.refs.setdefault(repo, {})[branch] = commit
        for p in folder.rglob("*"):
            if p.is_file():  # the Hub's etag of an LFS file is its sha256
                rel = p.relative_to(folder).as_posix()
                self.etags[(repo, commit, rel)] = hashlib.sha256(p.read_bytes()).hexdigest()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def fetched(self) -> list[str]:
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p in self.log
                if m == "GET" and "/resolve/" in p]

    @staticmethod
    def _send(h, code, payload=b"", headers=None, body=True):
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _error(self, h, code, err, body):
        self._send(h, 404, json.dumps({"error": code}).encode(),
                   {"X-Error-Code": code, "X-Error-Message": err,
                    "Content-Type": "application/json"}, body)

    def _lookup(self, h, repo, rev, body):
        if repo not in self.repos:
            self._error(h, "RepoNotFound", f"Repository {repo} not found", body)
            return None
        commit = self.refs[repo].get(rev, rev)
        if commit not in self.repos[repo]:
            self._error(h, "RevisionNotFound", f"Invalid rev id: {rev}", body)
            return None
        return commit

    def _handle(self, h, body):
        path = urlsplit(h.path).path
        self.log.append((h.command, path))
        parts = [unquote(x) for x in path.strip("/").split("/")]
        if parts[:2] == ["api", "datasets"] and len(parts) >= 6:
            repo, kind, rev, sub = f"{parts[2]}/{parts[3]}", parts[4], parts[5], parts[6:]
            commit = self._lookup(h, repo, rev, body)
            if commit is None:
                return
            folder = self.repos[repo][commit]
            files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                           if p.is_file())
            if kind == "revision":
                out = {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]}
            else:  # tree: recursive listing (one page)
                out = []
                for f in files:
                    if sub and not f.startswith("/".join(sub) + "/"):
                        continue
                    data = (folder / f).read_bytes()
                    oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                    out.append({"type": "file", "path": f, "size": len(data), "oid": oid})
            self._send(h, 200, json.dumps(out).encode(), {"Content-Type": "application/json"},
                       body)
        elif parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve":
            repo, rev, rel = f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:])
            commit = self._lookup(h, repo, rev, body)
            if commit is None:
                return
            f = self.repos[repo][commit] / rel
            if not f.is_file():
                self._error(h, "EntryNotFound", f"{rel} does not exist", body)
                return
            data = f.read_bytes()
            etag = self.etags.get((repo, commit, rel)) or hashlib.sha256(data).hexdigest()
            self._send(h, 200, data, {"X-Repo-Commit": commit, "ETag": f'"{etag}"',
                                      "Content-Type": "application/octet-stream"}, body)
        else:
            self._send(h, 404, b"not found", {}, body)


def _copy_tree(src: Path, dst: Path) -> Path:
    """Copy a release with hard links where possible (never write through them: replace)."""
    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link)
    return dst


def _replace(p: Path, data: bytes) -> None:
    """Give ``p`` new bytes without touching the inode it may share with releases/tiny."""
    p.unlink()
    p.write_bytes(data)


@pytest.fixture(scope="module")
def hub_repo(tmp_path_factory):
    """The Hub repo of tiny as the maintainers' push lays it out: release files + README.md."""
    d = _copy_tree(TINY, tmp_path_factory.mktemp("hubrepo") / "tiny")
    (d / hub.CARD_FILE).write_text(str(hub.dataset_card(d, REPO)))
    (d / ".gitattributes").write_text("*.npy filter=lfs diff=lfs merge=lfs -text\n")
    return d


@pytest.fixture(scope="module")
def fake_hub(hub_repo):
    h = FakeHub()
    h.add(REPO, COMMIT, hub_repo)
    yield h
    h.close()


@pytest.fixture
def registry(tmp_path, monkeypatch, fake_hub):
    """A registry pinning tiny to the fake commit, the fake Hub as endpoint, a fresh cache."""
    reg = json.loads(REGISTRY_FILE.read_text())
    reg["releases"]["tiny"]["revision"] = COMMIT
    p = tmp_path / "registry.json"
    p.write_text(json.dumps(reg))
    monkeypatch.setenv("BT_BENCH_REGISTRY", str(p))
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fake_hub.log.clear()
    return p


def _pinned() -> str:
    return load_registry(REGISTRY_FILE)["tiny"].manifest_sha256


def _manifest_files() -> dict:
    return json.loads((TINY / MANIFEST).read_text())["files"]


# ---------------------------------------------------------------------- registry
def test_registry_pins_the_shipped_tiny():
    reg = load_registry(REGISTRY_FILE)
    e = reg["tiny"]
    assert e.manifest_sha256 == hashlib.sha256((TINY / MANIFEST).read_bytes()).hexdigest()
    assert e.revision is None or len(e.revision) == 40  # null until the maintainers push
    assert (ROOT / e.shipped / MANIFEST).is_file() and e.repo_id == REPO
    rel = load_release("tiny")
    assert rel.path.resolve() == TINY.resolve() and rel.manifest_sha256 == e.manifest_sha256
    assert rel.hub_revision == e.revision


@pytest.mark.parametrize("key,value,match", [
    ("revision", "main", r"revision 'main' is not a commit SHA; expected 40"),
    ("manifest_sha256", "abc", r"manifest_sha256 'abc' is not a sha256"),
    ("repo_id", "tiny", r"repo_id 'tiny' is not a Hub repo id; expected 'org/name'"),
])
def test_registry_rejects_malformed_entries(tmp_path, key, value, match):
    reg = json.loads(REGISTRY_FILE.read_text())
    reg["releases"]["tiny"][key] = value
    (tmp_path / "r.json").write_text(json.dumps(reg))
    with pytest.raises(ReleaseError, match=match):
        load_registry(tmp_path / "r.json")


def test_unregistered_id_names_the_registered_ones():
    with pytest.raises(ReleaseError, match=r"'nope' is not in the release registry.*'tiny'"):
        hub.download_release("nope")
    ids = r"\['tiny', 'tiny-1.0.0', 'tiny-2.0.0'\]"
    with pytest.raises(ReleaseError, match=r"no release 'nope'.*registered ids: " + ids):
        resolve_release("nope")


# ---------------------------------------------------------------------- download
def test_download_round_trip(registry, fake_hub, tmp_path):
    got = hub.download_release("tiny", cache_dir=tmp_path / "cache")
    snap = tmp_path / "cache" / "datasets--bt-bench--tiny" / "snapshots" / COMMIT
    assert got.path == snap and got.revision == COMMIT and got.verified and not got.repaired
    files = _manifest_files()
    on_disk = [p for p in TINY.rglob("*") if p.is_file() and p.name != MANIFEST]
    assert got.n_files == len(files) == len(on_disk) == 156  # tiny 3.0: 52 files per seed
    # only the manifest and the files it lists (no README, no .gitattributes), each at most
    # once: files with equal bytes share one blob (tokenizers of the seeds)
    fetched = fake_hub.fetched()
    assert set(fetched) <= {MANIFEST, *files} and len(fetched) == len(set(fetched))
    assert {files[f]["sha256"] for f in fetched if f != MANIFEST} == {
        m["sha256"] for m in files.values()}
    for rel, meta in files.items():
        assert (snap / rel).is_symlink()  # the real cache layout: snapshot -> blobs/<etag>
        assert (snap / rel).resolve().name == meta["sha256"]
    rel = load_release(snap)
    assert rel.hub_revision == COMMIT and rel.hub_repo_id == REPO
    # a second call downloads nothing
    fake_hub.log.clear()
    assert hub.download_release("tiny", cache_dir=tmp_path / "cache").path == snap
    assert fake_hub.fetched() == []


def test_offline_is_served_from_the_cache(registry, fake_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    hub.download_release("tiny", cache_dir=cache)
    fake_hub.log.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    got = hub.download_release("tiny", cache_dir=cache)
    assert got.verified and got.revision == COMMIT and fake_hub.log == []
    # a release id resolves to the cached snapshot when it is not in releases_dir()
    monkeypatch.setenv("BT_BENCH_RELEASES", str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert resolve_release("tiny") == got.path
    assert load_release("tiny").hub_revision == COMMIT


def test_no_cache_and_no_network_says_how_to_get_the_files(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ReleaseError, match=r"not in the Hugging Face cache .*HF_HUB_OFFLINE is "
                       r"set.*bt-bench download tiny.*ships in the bt-bench repository at "
                       r"releases/tiny"):
        hub.download_release("tiny", cache_dir=tmp_path / "cache")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    # huggingface_hub retries a refused connection with backoff (about 23 s of sleeps): skip
    # the sleeps, keep the retries
    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(hf_http.time, "sleep", lambda s: None)
    with pytest.raises(ReleaseError,
                       match=r"the Hub could not be reached \(ConnectError: .*refused\)"):
        hub.download_release("tiny", cache_dir=tmp_path / "cache")


def test_missing_revision_is_rejected(registry, fake_hub, tmp_path, monkeypatch):
    with pytest.raises(ReleaseError, match=rf"revision '{OTHER}' does not exist in Hub dataset "
                       rf"{REPO}.*Drop --revision to use the pinned one \({COMMIT}\)"):
        hub.download_release("tiny", OTHER, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "datasets--bt-bench--tiny" / "snapshots").exists()
    # no pinned revision and none given
    reg = json.loads(registry.read_text())
    reg["releases"]["tiny"]["revision"] = None
    registry.write_text(json.dumps(reg))
    with pytest.raises(ReleaseError, match=r"no pinned Hub revision .*ships in the bt-bench "
                       r"repository at releases/tiny.*pass --revision SHA"):
        hub.download_release("tiny", cache_dir=tmp_path / "cache")


def test_a_branch_is_resolved_and_its_commit_recorded(registry, tmp_path):
    got = hub.download_release("tiny", "main", cache_dir=tmp_path / "cache")
    assert got.revision == COMMIT and got.path.name == COMMIT


def test_tampered_cache_file_is_never_used_and_a_rerun_repairs_it(registry, fake_hub, tmp_path,
                                                                   monkeypatch):
    cache = tmp_path / "cache"
    snap = hub.download_release("tiny", cache_dir=cache).path
    bad = snap / "seed1" / "sketches.npy"
    blob = bad.resolve()
    blob.write_bytes(blob.read_bytes()[:-10] + b"0123456789")  # same size, other bytes
    with pytest.raises(ReleaseError, match=r"seed1/sketches.npy fails its checksum.*bt-bench "
                       rf"download tiny --revision {COMMIT}"):
        load_release(snap)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ReleaseError, match=r"release file .*seed1/sketches.npy fails its check "
                       r"\(sha256 [0-9a-f]{64}, expected [0-9a-f]{64}; 1 file\(s\).*rerun "
                       r"`bt-bench download tiny` with network access"):
        hub.download_release("tiny", cache_dir=cache)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    fake_hub.log.clear()
    got = hub.download_release("tiny", cache_dir=cache)
    assert got.repaired == ["seed1/sketches.npy"]
    assert fake_hub.fetched() == ["seed1/sketches.npy"]
    load_release(got.path)  # verifies every sha256


def test_partial_download_is_completed_on_rerun(registry, fake_hub, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    snap = hub.download_release("tiny", cache_dir=cache).path
    gone = "seed2/checkpoints/step0060/model.safetensors"
    (snap / gone).unlink()  # as if the download had been interrupted
    (snap / "seed0" / "config.json").resolve().write_bytes(b"{}")  # and a truncated file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ReleaseError, match=rf"incomplete .*{gone}.*rerun `bt-bench download "
                       "tiny` with network access"):
        hub.download_release("tiny", cache_dir=cache)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    got = hub.download_release("tiny", cache_dir=cache)
    assert got.repaired == ["seed0/config.json"]
    load_release(got.path)


def test_a_bad_file_on_the_hub_is_reported_not_used(tmp_path, monkeypatch, hub_repo):
    repo = _copy_tree(hub_repo, tmp_path / "repo")
    target = repo / "seed0" / "targets" / "qzxbt.npz"
    good = target.read_bytes()
    h = FakeHub()
    try:
        h.add(REPO, COMMIT, repo)
        _replace(target, good[:-1] + bytes([good[-1] ^ 1]))  # the stored object went bad
        reg = json.loads(REGISTRY_FILE.read_text())
        reg["releases"]["tiny"]["revision"] = COMMIT
        (tmp_path / "r.json").write_text(json.dumps(reg))
        monkeypatch.setenv("BT_BENCH_REGISTRY", str(tmp_path / "r.json"))
        with pytest.raises(ReleaseError, match=r"seed0/targets/qzxbt.npz of bt-bench/tiny at "
                           rf"{COMMIT} fails its check after a fresh download"):
            hub.download_release("tiny", cache_dir=tmp_path / "cache", endpoint=h.url)
    finally:
        h.close()


def test_a_revision_with_another_manifest_is_refused(tmp_path, monkeypatch, hub_repo):
    repo = _copy_tree(hub_repo, tmp_path / "repo")
    m = json.loads((repo / MANIFEST).read_text())
    m["release_version"] = "1.0.1"
    _replace(repo / MANIFEST, json.dumps(m).encode())
    h = FakeHub()
    try:
        h.add(REPO, COMMIT, repo)
        reg = json.loads(REGISTRY_FILE.read_text())
        reg["releases"]["tiny"]["revision"] = COMMIT
        (tmp_path / "r.json").write_text(json.dumps(reg))
        monkeypatch.setenv("BT_BENCH_REGISTRY", str(tmp_path / "r.json"))
        with pytest.raises(ReleaseError, match=r"manifest.json \(release 'tiny'.*has sha256 .*the "
                           rf"registry .* pins {_pinned()[:6]}"):
            hub.download_release("tiny", cache_dir=tmp_path / "cache", endpoint=h.url)
        assert h.fetched() == [MANIFEST, MANIFEST]  # nothing else was downloaded
    finally:
        h.close()


# ---------------------------------------------------------------------- CLI + evaluate
def test_cli_download_then_evaluate_matches_the_shipped_copy(registry, tmp_path):
    from benchmark.evaluate import EvalSettings, evaluate

    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "benchmark.cli", "download", "tiny",
                          "--cache-dir", str(cache)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    snap = cache / "datasets--bt-bench--tiny" / "snapshots" / COMMIT
    m = json.loads((TINY / MANIFEST).read_text())
    assert (f"{COMMIT}: {len(m['files'])} files, {m['total_bytes']:,} bytes, every sha256 "
            "verified") in out.stdout
    assert str(snap) in out.stdout
    # offline, from the cache
    off = subprocess.run([sys.executable, "-m", "benchmark.cli", "download", "tiny",
                          "--cache-dir", str(cache)], capture_output=True, text=True,
                         env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
                         timeout=300)
    assert off.returncode == 0 and str(snap) in off.stdout, off.stderr
    settings = EvalSettings(n_boot_precision=200, n_boot_auc=200, seeds=(0,), causal=False)
    est = ROOT / "estimators" / "examples" / "my_estimator.py"
    shipped = evaluate(est, TINY, settings, progress=False)
    downloaded = evaluate(est, snap, settings, progress=False)
    assert json.dumps(downloaded, sort_keys=True) == json.dumps(shipped, sort_keys=True)


def test_cli_download_without_pinned_revision_exits_2(capsys):
    from benchmark.cli import main

    if load_registry()["tiny"].revision is not None:
        pytest.skip("tiny is pinned to a Hub revision now")
    assert main(["download", "tiny"]) == 2
    assert "ships in the bt-bench repository at releases/tiny" in capsys.readouterr().err


CKPT_ESTIMATOR = """
import numpy as np
from estimators.base import BaseEstimator, cosine


class CheckpointReader(BaseEstimator):
    name = "checkpoint-reader"
    track = "gradient"
    tasks = ("rollouts",)

    def __init__(self) -> None:
        pass

    def score_rollouts(self, view):
        from safetensors.numpy import load_file

        w = load_file(str(view.checkpoint_dir[max(view.checkpoint_steps)] / "model.safetensors"))
        assert len(w) > 0
        return cosine(view.sketches, view.target("nll"))
"""


def test_sandboxed_estimator_reads_checkpoints_of_a_cache_copy(registry, tmp_path):
    from benchmark.evaluate import EvalSettings, evaluate

    snap = hub.download_release("tiny", cache_dir=tmp_path / "cache").path
    est = tmp_path / "checkpoint_reader.py"
    est.write_text(CKPT_ESTIMATOR)
    res = evaluate(est, snap, EvalSettings(n_boot_precision=50, n_boot_auc=50, seeds=(0,),
                                                causal=False),
                   progress=False)
    assert res["release"]["id"] == "tiny"


# ---------------------------------------------------------------------- card and push plan
def test_dataset_card_is_valid_hub_metadata(hub_repo):
    import datasets
    from huggingface_hub import DatasetCard, DatasetCardData
    from huggingface_hub.repocard import metadata_load

    card = DatasetCard.load(hub_repo / hub.CARD_FILE, repo_type="dataset")
    assert isinstance(card.data, DatasetCardData)
    meta = metadata_load(hub_repo / hub.CARD_FILE)
    assert meta == card.data.to_dict()
    assert meta["license"] == "apache-2.0" and meta["size_categories"] == ["10K<n<100K"]
    names = [c["config_name"] for c in meta["configs"]]
    assert names == ["rollouts", "draws", "behavior_curve"] and meta["configs"][0]["default"]
    for section in ("## Protocol", "## Files", "## License", "## Citation", "Apache-2.0",
                    _pinned(), "`qzxbt`", "`vkwjp`", "`frobnitz` -> `QZXBT`",
                    "`snarfle` -> `VKWJP`"):
        assert section in card.text
    # the configs resolve the way the Hub viewer resolves them (datasets reads the YAML header)
    ds = datasets.load_dataset(str(hub_repo), "rollouts", split="seed1")
    assert ds.num_rows == 3840 and "sketch_row" in ds.column_names
    assert not any(c.startswith(("bonus", "group_label")) for c in ds.column_names)
    draws = datasets.load_dataset(str(hub_repo), "draws", split="seed2")
    assert draws.num_rows > 0 and "token_sketch_row" in draws.column_names
    curve = datasets.load_dataset(str(hub_repo), "behavior_curve")
    assert sorted(curve) == ["seed0", "seed1", "seed2"]


def test_upload_plan_is_the_manifest_files_and_the_card(tmp_path):
    run = _copy_tree(TINY, tmp_path / "run")
    (run / ".work").mkdir()
    (run / ".work" / "state.json").write_text("{}")
    (run / "notes.txt").write_text("not part of the release")
    ops = hub.upload_plan(run, REPO)
    files = _manifest_files()
    assert [op.path_in_repo for op in ops] == [MANIFEST, *sorted(files), hub.CARD_FILE]
    for op in ops[1:-1]:  # CommitOperationAdd hashed what it will upload
        assert op.upload_info.sha256.hex() == files[op.path_in_repo]["sha256"]
        assert op.upload_info.size == files[op.path_in_repo]["size"]
    assert ops[-1].path_or_fileobj.startswith(b"---\nlicense: apache-2.0\n")
    _replace(run / "seed0" / "sketch.json", b"{}")
    with pytest.raises(ReleaseError, match=r"seed0/sketch.json fails its checksum"):
        hub.upload_plan(run, REPO)


def test_push_rejects_a_bad_repo_id_before_any_network():
    with pytest.raises(ReleaseError, match=r"--repo-id 'tiny' is not a Hub repo id"):
        hub.push_release(TINY, "tiny")
