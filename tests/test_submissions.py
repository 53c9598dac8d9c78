"""Submissions on a small real release: submit, strict metadata, verify (pass, drift, code)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from benchmark.cli import main
from benchmark.contract import EstimatorContractError
from benchmark.errors import ReleaseError
from benchmark.submissions import (
    ALLOWED_KEYS,
    FLOAT_TOLERANCE,
    SubmissionError,
    compare_results,
    find_submissions,
    load_submission,
    submit,
    validate_metadata,
    verify_submission,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "estimators" / "examples" / "my_estimator.py"


@pytest.fixture(scope="module")
def subs(micro_causal, tmp_path_factory) -> Path:
    """A submissions folder with the example estimator (via the CLI) and the random control,
    scored with causal scores on the micro release."""
    root = tmp_path_factory.mktemp("subs") / "submissions"
    rc = main(["submit", str(EXAMPLE), "--name", "in-context-cosine", "--authors", "Ada Lovelace",
               "Alan Turing", "--link", "https://example.org/paper", "--description",
               "cosine with the in-context target", "--release", str(micro_causal),
               "--submissions-dir", str(root), "--no-progress", "--no-panel"])
    assert rc == 0
    submit(ROOT / "estimators" / "controls" / "random.py", "random", ["bt-bench"],
           release=micro_causal, submissions_dir=root, progress=False)
    return root


def _copy(sub: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "submissions" / sub.name
    shutil.copytree(sub, dst)
    return dst


# ----------------------------------------------------------------------------------------------
# submit


def test_submit_writes_the_three_files(subs):
    sub = subs / "in-context-cosine"
    assert sorted(p.name for p in sub.iterdir()) == ["estimator.py", "results.json",
                                                     "submission.yaml"]
    assert (sub / "estimator.py").read_bytes() == EXAMPLE.read_bytes()
    meta = yaml.safe_load((sub / "submission.yaml").read_text())
    frozen = meta.pop("frozen")  # the file's sha256 and the UTC time it was frozen (seasons)
    cost = meta.pop("cost")  # what this evaluation took here: scoring seconds, no env
    assert set(cost) == {"release", "score_rollouts_s", "env_build_s", "machine"}
    assert cost["release"] == "micro" and cost["env_build_s"] is None
    assert 0 < cost["score_rollouts_s"] < 600 and "cores" in cost["machine"]
    assert meta == {"name": "in-context-cosine", "authors": ["Ada Lovelace", "Alan Turing"],
                    "track": "gradient", "kind": "estimator", "link": "https://example.org/paper",
                    "description": "cosine with the in-context target"}
    import hashlib
    from datetime import UTC, datetime, timedelta

    assert frozen["sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    when = datetime.strptime(frozen["utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert timedelta(0) <= datetime.now(UTC) - when < timedelta(hours=1)
    meta["cost"], meta["frozen"] = cost, frozen
    assert list(meta) == [k for k in ALLOWED_KEYS if k in meta]
    results = json.loads((sub / "results.json").read_text())
    assert results["estimator"]["name"] == "in-context-cosine"
    assert results["estimator"]["file"] == "estimator.py"
    assert results["release"]["id"] == "micro"
    # a control file is recognised as a control
    assert load_submission(subs / "random").meta["kind"] == "control"
    # no temporary folders are left behind
    assert sorted(p.name for p in subs.iterdir()) == ["in-context-cosine", "random"]


def test_submit_refuses_to_overwrite_without_force(subs, micro_release):
    with pytest.raises(SubmissionError, match=r"already exists.*--force"):
        submit(EXAMPLE, "in-context-cosine", ["x"], release=micro_release, submissions_dir=subs,
               progress=False)


def test_submit_force_replaces(micro_release, tmp_path):
    root = tmp_path / "submissions"
    first = submit(EXAMPLE, "mine", ["A"], release=micro_release, submissions_dir=root,
                   progress=False)
    (first / "stray.txt").write_text("left over")
    submit(EXAMPLE, "mine", ["B"], release=micro_release, submissions_dir=root, force=True,
           progress=False)
    assert load_submission(root / "mine").meta["authors"] == ["B"]
    assert not (root / "mine" / "stray.txt").exists()
    assert [p.name for p in root.iterdir()] == ["mine"]


def test_failed_submit_leaves_no_partial_folder(micro_release, tmp_path):
    root = tmp_path / "submissions"
    bad = tmp_path / "bad.py"
    bad.write_text("class A:\n    pass\n")
    with pytest.raises(EstimatorContractError):
        submit(bad, "bad", ["A"], release=micro_release, submissions_dir=root, progress=False)
    # a failure after the temporary folder exists (release missing) cleans it up
    with pytest.raises(ReleaseError):
        submit(EXAMPLE, "late-failure", ["A"], release=tmp_path / "no-such-release",
               submissions_dir=root, progress=False)
    assert not root.exists() or list(root.iterdir()) == []


def test_submit_rejects_a_control_name(tmp_path, micro_release):
    f = tmp_path / "fake_random.py"
    f.write_text((ROOT / "estimators" / "controls" / "random.py").read_text()
                 + "\n# changed\n")
    with pytest.raises(SubmissionError, match=r"name 'random' is the name of the evaluator's"):
        submit(f, "my-random", ["A"], release=micro_release, submissions_dir=tmp_path / "s",
               progress=False)


def test_submit_validates_arguments_before_evaluating(tmp_path):
    with pytest.raises(SubmissionError, match=r"name 'Bad_Name' is not valid"):
        submit(EXAMPLE, "Bad_Name", ["A"], submissions_dir=tmp_path, progress=False)
    with pytest.raises(SubmissionError, match=r"no authors given; pass --authors"):
        submit(EXAMPLE, "ok", None, submissions_dir=tmp_path, progress=False)
    with pytest.raises(SubmissionError, match=r"link 'ftp://x' is not a URL"):
        submit(EXAMPLE, "ok", ["A"], link="ftp://x", submissions_dir=tmp_path, progress=False)


# ----------------------------------------------------------------------------------------------
# submission.yaml


GOOD = {"name": "my-est", "authors": ["A"], "track": "gradient"}
COST = {"release": "tiny", "score_rollouts_s": 61.5, "env_build_s": None,
        "machine": "AMD EPYC, 2 cores (AVX512)"}


def test_metadata_defaults_and_order():
    assert validate_metadata(dict(GOOD)) == {**GOOD, "kind": "estimator"}
    full = {**GOOD, "cost": {**COST, "env_build_s": 12}, "status": "does-not-run-here",
            "reason": " needs CUDA "}
    meta = validate_metadata(full)
    assert meta["cost"] == {**COST, "env_build_s": 12.0} and meta["reason"] == "needs CUDA"
    assert list(meta) == ["name", "authors", "track", "kind", "status", "reason", "cost"]


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({**GOOD, "team": "x"}, r"unknown key\(s\) team; allowed keys are name, authors, track, "
                                r"kind, link, description"),
        ({"name": "a", "track": "gradient"}, r"missing required key\(s\) authors; required keys "
                                             r"are name, authors, track \(allowed keys: name, "),
        ({"authors": ["A"]}, r"missing required key\(s\) name, track"),
        ({**GOOD, "name": "-x"}, r"name '-x' is not valid"),
        ({**GOOD, "authors": []}, r"authors \[\] must be a non-empty list"),
        ({**GOOD, "authors": "A"}, r"authors 'A' must be a non-empty list"),
        ({**GOOD, "track": "text"}, r"track 'text' is not one of gradient, open"),
        ({**GOOD, "kind": "baseline"}, r"kind 'baseline' is not one of estimator, control"),
        ({**GOOD, "link": "example.org"}, r"link 'example.org' is not a URL"),
        ({**GOOD, "description": "two\nlines"}, r"description must be one non-empty line"),
        # text that reaches the leaderboard: full matches, no control or format characters
        ({**GOOD, "name": "my-est\n"}, r"name 'my-est\\n' is not valid"),
        ({**GOOD, "link": "https://example.org\n"}, r"link 'https://example.org\\n' is not a URL"),
        ({**GOOD, "link": "https://exa mple.org"}, r"is not a URL; expected http\(s\):// and "
                                                   r"printable ASCII without spaces"),
        ({**GOOD, "link": "https://example.org/\u202etxt.exe"}, r"is not a URL"),
        ({**GOOD, "description": "fine \u202eenil"},
         r"description 'fine \\u202eenil' contains control or format characters \(U\+202E\); "
         r"expected one line of plain text: remove them"),
        ({**GOOD, "description": "a\u2028b"}, r"\(U\+2028\)"),
        ({**GOOD, "description": "a\tb\x1b[2K"}, r"\(U\+0009, U\+001B\)"),
        ({**GOOD, "authors": ["Ada\u200b"]}, r"author 'Ada\\u200b' contains control or format "
                                              r"characters \(U\+200B\); expected a name"),
        (["name", "authors"], r"expected a YAML mapping with the keys name, authors"),
        # status and reason: an entry that cannot run here says why, in one line
        ({**GOOD, "status": "broken"}, r"status 'broken' is not one of runs, does-not-run-here; "
                                       r"omit it for an entry that runs"),
        ({**GOOD, "status": "does-not-run-here"},
         r"status does-not-run-here needs reason: one line of at most 2000 characters with the "
         r"exact error and the version tried, got None\."),
        ({**GOOD, "status": "does-not-run-here", "reason": "a\nb"}, r"needs reason: one line"),
        ({**GOOD, "status": "does-not-run-here", "reason": "x" * 2001}, r"at most 2000"),
        ({**GOOD, "status": "does-not-run-here", "reason": "bad \u202e"},
         r"reason 'bad \\u202e' contains control or format characters"),
        ({**GOOD, "reason": "why"}, r"reason is only for status: does-not-run-here"),
        # cost: written by submit, validated strictly
        ({**GOOD, "cost": {"score_rollouts_s": 1.0}},
         r"cost must be \{release: <release id>, score_rollouts_s: <seconds>, env_build_s: "
         r"<seconds or null>, machine: <one line>\} as bt-bench submit writes it; got "
         r"\['score_rollouts_s'\]"),
        ({**GOOD, "cost": {**COST, "score_rollouts_s": -1}},
         r"cost\.score_rollouts_s -1 is not a duration; expected seconds from 0 to 604800"),
        ({**GOOD, "cost": {**COST, "env_build_s": True}}, r"cost\.env_build_s True is not a "),
        ({**GOOD, "cost": {**COST, "score_rollouts_s": None}},
         r"cost\.score_rollouts_s None is not a duration"),
        ({**GOOD, "cost": {**COST, "machine": "a\nb"}},
         r"cost\.machine 'a\\nb' contains control or format characters"),
        ({**GOOD, "cost": {**COST, "release": ""}}, r"cost\.release '' must be one line"),
        ({**GOOD, "cost": [1]}, r"cost must be .*; got list"),
    ],
)
def test_metadata_errors(meta, message):
    with pytest.raises(SubmissionError, match=message):
        validate_metadata(meta, "submission.yaml")


def test_load_submission_checks_folder_name_and_track(subs, tmp_path):
    sub = _copy(subs / "random", tmp_path)
    meta = yaml.safe_load((sub / "submission.yaml").read_text())
    (sub / "submission.yaml").write_text(yaml.safe_dump({**meta, "name": "other"}))
    with pytest.raises(SubmissionError, match=r"name 'other' differs from the folder name"):
        load_submission(sub)
    (sub / "submission.yaml").write_text(yaml.safe_dump({**meta, "track": "open"}))
    with pytest.raises(SubmissionError, match=r"track 'open' differs from the estimator's "
                                               r"declared track 'gradient'"):
        load_submission(sub)
    (sub / "submission.yaml").write_text(yaml.safe_dump({**meta, "extra": 1}))
    with pytest.raises(SubmissionError, match=r"unknown key\(s\) extra"):
        load_submission(sub)
    (sub / "results.json").unlink()
    with pytest.raises(SubmissionError, match=r"missing results.json"):
        load_submission(sub)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r["estimator"].update(name="x\u202egnp"),
     r"results\.json: estimator\.name 'x\\u202egnp' contains control or format characters "
     r"\(U\+202E\); expected plain text: bt-bench never writes them, so the file was edited: "
     r"regenerate it with bt-bench submit FILE --name NAME --force\.$"),
    (lambda r: r.update(verdict="pass\n| 1 | fake |"), r"results\.json: verdict 'pass\\n"),
    (lambda r: r["tasks"]["t"].update({"a\u2029": 1}), r"the key 'tasks\.t\.a\\u2029'"),
    (lambda r: r["tasks"]["t"]["checklist"].append("\x00"), r"tasks\.t\.checklist\.0 '\\x00'"),
])
def test_load_submission_refuses_control_characters_in_results(tmp_path, edit, message):
    """bt-bench never writes such text; edited into a committed results.json it is refused
    before anything reads it (verify, the leaderboard)."""
    sub = tmp_path / "mine"
    sub.mkdir()
    (sub / "estimator.py").write_text("x = 1\n")
    (sub / "submission.yaml").write_text(yaml.safe_dump({**GOOD, "name": "mine"}))
    results = {"schema_version": 3, "suite": {}, "verdict": "fail",
               "release": {"id": "tiny", "manifest_sha256": "a" * 64, "tasks": ["t"]},
               "estimator": {"track": "gradient", "name": "mine", "class": "Mine",
                             "sha256": "b" * 64, "tasks": ["rollouts"]},
               "tasks": {"t": {"checklist": [], "verdict": "fail"}}}
    (sub / "results.json").write_text(json.dumps(results))
    assert load_submission(sub).results == results
    edit(results)
    (sub / "results.json").write_text(json.dumps(results))
    with pytest.raises(SubmissionError, match=message):
        load_submission(sub)


def test_underscore_folders_are_not_submissions(tmp_path):
    for name in ("b", "a", "_reference", ".hidden"):
        (tmp_path / name).mkdir()
    assert [p.name for p in find_submissions(tmp_path)] == ["a", "b"]


# ----------------------------------------------------------------------------------------------
# verify


def test_verify_passes_on_an_untouched_submission(subs, micro_causal, capsys):
    rc = main(["verify", str(subs / "in-context-cosine"), str(subs / "random"), "--release",
               str(micro_causal), "--no-progress", "--no-live-check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "in-context-cosine: ok" in out and "2 of 2 submission(s) reproduced." in out


def test_verify_dump_writes_what_it_recomputed_byte_for_byte_twice(subs, micro_causal,
                                                                   tmp_path, capsys):
    """``--dump``: the recomputed results, in the committed encoding, the same bytes each run."""
    for run in ("a", "b"):
        assert main(["verify", str(subs / "random"), "--release", str(micro_causal),
                     "--no-progress", "--no-live-check", "--dump", str(tmp_path / run)]) == 0
    capsys.readouterr()
    a, b = ((tmp_path / run / "random.json").read_bytes() for run in ("a", "b"))
    assert a == b
    dumped = json.loads(a)
    assert dumped["estimator"]["name"] == "random" and "tasks" in dumped


def test_verify_passes_on_another_machine_and_no_verdict_flips(subs, micro_causal, tmp_path,
                                                               monkeypatch):
    """Emulate another CPU: every replay sums its batched update in another order, no cache."""
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "other-machine"))
    monkeypatch.setenv("BT_BENCH_REPLAY_ROW_ORDER", "reversed")
    report = verify_submission(subs / "in-context-cosine", micro_causal, progress=False)
    assert report.ok, report.format()
    assert (tmp_path / "other-machine" / "replays").is_dir()  # it replayed, it did not reuse


def test_verify_fails_naming_the_metric_when_results_are_edited(subs, micro_causal, tmp_path,
                                                                capsys):
    sub = _copy(subs / "in-context-cosine", tmp_path)
    res = json.loads((sub / "results.json").read_text())
    task = res["tasks"]["qzxbt"]
    window = task["seeds"]["0"]["training"]["in-context-cosine"]["rollout"]["group"]["window"]
    window["precision"] = round(window["precision"] + 0.01, 10)
    task["checklist"][0]["verdict"] = "pass" if task["checklist"][0]["verdict"] != "pass" \
        else "fail"
    task["checklist"][0]["per"]["0"]["reason"] = "a different explanation"  # never compared
    res["packages"]["numpy"] = "0.0.0"  # machine-specific: reported, never a failure
    (sub / "results.json").write_text(json.dumps(res, indent=2, sort_keys=True))
    rc = main(["verify", str(sub), "--release", str(micro_causal), "--no-progress",
               "--no-live-check"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILED (2 values differ)" in out
    assert ("tasks.qzxbt.seeds.0.training.in-context-cosine.rollout.group.window.precision: "
            "committed") in out
    assert "tasks.qzxbt.checklist.magnitude.verdict: committed" in out
    assert "note (not checked, machine-specific): packages.numpy" in out
    assert "code changed" not in out


def test_verify_fails_when_the_code_changes_its_output(subs, micro_causal, tmp_path):
    sub = _copy(subs / "in-context-cosine", tmp_path)
    est = sub / "estimator.py"
    est.write_text(est.read_text().replace(
        "return sketch_cosine(view, view.target(self.target))",
        "return -sketch_cosine(view, view.target(self.target))"))
    report = verify_submission(sub, micro_causal, progress=False)
    assert not report.ok and report.code_changed
    text = report.format()
    assert f"{est}: the estimator code changed" in text
    assert "estimator.sha256: committed" in text
    assert any(d.path.startswith("tasks.") and ".training.in-context-cosine." in d.path
               for d in report.drifts)


def test_verify_with_no_submissions_is_an_error(tmp_path):
    (tmp_path / "_reference").mkdir()
    assert main(["verify", "--submissions-dir", str(tmp_path)]) == 2


# ----------------------------------------------------------------------------------------------
# compare_results


def test_compare_results_tolerance_and_types():
    a = {"x": 0.5, "n": 3, "v": "pass", "ok": True, "none": None, "l": [1.0, 2.0]}
    assert compare_results(a, dict(a)) == []
    close = {**a, "x": 0.5 + FLOAT_TOLERANCE / 2}
    assert compare_results(a, close) == []
    far = {**a, "x": 0.5 + 3 * FLOAT_TOLERANCE}
    assert [d.path for d in compare_results(a, far)] == ["x"]
    assert [d.path for d in compare_results(a, {**a, "n": 4})] == ["n"]  # ints are exact
    assert [d.path for d in compare_results(a, {**a, "ok": 1})] == ["ok"]  # bool is not int
    assert [d.path for d in compare_results(a, {**a, "none": 0.0})] == ["none"]
    assert [d.path for d in compare_results(a, {**a, "l": [1.0]})] == ["l (length)"]
    assert [d.path for d in compare_results(a, {**a, "l": [1.0, 2.1]})] == ["l.1"]
    missing = dict(a)
    del missing["v"]
    assert [str(d) for d in compare_results(a, missing)] == [
        "v: committed 'pass', recomputed (absent)"]
    assert [d.path for d in compare_results({"c": [{"key": "timing", "verdict": "pass"}]},
                                            {"c": [{"key": "timing", "verdict": "fail"}]})] == [
        "c.timing.verdict"]
    # numbers from replays get the causal tolerance; explanations are never compared
    causal = {"tasks": {"t": {"causal": {"per_seed": {"0": {"x": 0.5, "reason": "0.042"}}}}}}
    near = {"tasks": {"t": {"causal": {"per_seed": {"0": {"x": 0.505, "reason": "0.043"}}}}}}
    assert compare_results(causal, near) == []
    off = {"tasks": {"t": {"causal": {"per_seed": {"0": {"x": 0.52, "reason": "0.042"}}}}}}
    assert [d.path for d in compare_results(causal, off)] == ["tasks.t.causal.per_seed.0.x"]
    assert compare_results({"suite": {"causal_score": {"a": {"lo": 0.1}}}},
                           {"suite": {"causal_score": {"a": {"lo": 0.105}}}}) == []


def test_compare_results_decodes_stored_arrays_and_compares_their_numbers():
    import numpy as np

    from benchmark.causal.score import encode_array
    from benchmark.submissions import CAUSAL_TOLERANCE

    x = np.linspace(-0.5, 0.5, 24).reshape(2, 3, 4)
    a = {"tasks": {"t": {"causal": {"d": encode_array(x)}}}, "other": {"d": encode_array(x)}}
    assert compare_results(a, a) == []
    # a tiny difference (another machine's last bits) changes the string, not the verdict
    near = x.copy()
    near[1, 2, 3] += CAUSAL_TOLERANCE / 2
    b = {"tasks": {"t": {"causal": {"d": encode_array(near)}}}, "other": {"d": encode_array(x)}}
    assert b["tasks"]["t"]["causal"]["d"]["data"] != a["tasks"]["t"]["causal"]["d"]["data"]
    assert compare_results(a, b) == []
    # a real change is named by its index; outside a causal path the float tolerance applies
    far = x.copy()
    far[0, 1, 2] += 3 * CAUSAL_TOLERANCE
    c = {"tasks": {"t": {"causal": {"d": encode_array(far)}}}, "other": {"d": encode_array(near)}}
    drifts = compare_results(a, c)
    assert [d.path for d in drifts] == ["other.d[1, 2, 3]", "tasks.t.causal.d[0, 1, 2]"]
    assert drifts[1].committed == pytest.approx(x[0, 1, 2])
    # a shape change or an unreadable array is one drift
    d = {**a, "other": {"d": encode_array(x[:1])}}
    assert [str(v) for v in compare_results(a, d)] == ["other.d (shape): committed [2, 3, 4], "
                                                       "recomputed [1, 3, 4]"]
    e = {**a, "other": {"d": dict(encode_array(x), data="!!")}}
    assert "not a readable encoded array" in str(compare_results(a, e)[0])


def test_leaderboard_ranks_scored_submissions_by_paired_comparisons(subs, tmp_path):
    """Two real evaluations with causal scores (micro): the leaderboard recomputes each entry's
    replicates from its results file alone; the pairwise table and the ranks follow from them."""
    import numpy as np

    from benchmark.leaderboard import generate
    from benchmark.leaderboard.paired import entry_replicates

    res = {n: json.loads((subs / n / "results.json").read_text())
           for n in ("in-context-cosine", "random")}
    # the same method scored in two evaluations gets the same score and interval: the random
    # control beside the example estimator is the random submission's own entry (paired data)
    for t in ("qzxbt", "vkwjp"):
        assert res["in-context-cosine"]["tasks"][t]["summary"]["causal_score"]["random"] == \
            res["random"]["tasks"][t]["summary"]["causal_score"]["random"]
    generate(subs, tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    (rel,) = data["releases"]
    tables = [("suite", rel["suite"]["tracks"][0])] + [(t["id"], t["tracks"][0])
                                                       for t in rel["tasks"]]
    est = {"in-context-cosine": "in-context-cosine", "random": "random"}
    reps = {n: entry_replicates(n, r, ["qzxbt", "vkwjp"]) for n, r in res.items()}
    for scope, table in tables:
        pw = table["pairwise"]
        assert sorted(pw) == ["in-context-cosine", "random"]
        rows = {r["name"]: r for r in table["rows"]}
        a, b = "in-context-cosine", "random"
        # the difference's point is the difference of the recorded scores; numbers are written
        # rounded to 10 decimals (<= 5e-11 each, 1e-10 for a difference; derived)
        assert pw[a][b]["point"] == pytest.approx(
            rows[a]["causal_score"]["point"] - rows[b]["causal_score"]["point"], abs=1e-9)
        want = np.quantile(reps[a][scope][1] - reps[b][scope][1], [0.025, 0.975])
        assert [pw[a][b]["lo"], pw[a][b]["hi"]] == pytest.approx(want.tolist(), abs=1e-9)
        for r in table["rows"]:
            assert r["rank"] == 1 + sum(pw[o][r["name"]]["verdict"] == "better"
                                        for o in pw if o != r["name"])
        assert {r["name"]: res[r["name"]]["estimator"]["name"] for r in table["rows"]} == est
    md = (tmp_path / "lb" / "README.md").read_text()
    assert "Significantly better than" in md
    assert 'class="pairwise"' in (tmp_path / "lb" / "index.html").read_text()


@pytest.mark.parametrize(("text", "says"), [
    ("name: x\n" + "description: " + "a" * 70_000 + "\n", "more than the 65536"),
    ("name: " + "[" * 50 + "]" * 50 + "\n", "nested 50 levels deep"),
    ("name: [" + "[" * 5000 + "\n", "nested 5001 levels deep"),
    (b"name: \xff\xfe\n", "not UTF-8"),
    ("name: {unclosed\n", "not valid YAML"),
])
def test_a_crafted_submission_yaml_is_refused_within_limits(tmp_path, text, says):
    """Size, encoding and nesting are checked before the YAML parser runs (a deep flow list
    would otherwise reach its RecursionError); every refusal is a SubmissionError naming the
    file (issue 35)."""
    from benchmark.submissions.files import read_metadata

    f = tmp_path / "submission.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SubmissionError, match=f"{f}: .*{says}"):
        read_metadata(f)


# ----------------------------------------------------------------------------------------------
# entries that do not run here


def _not_running(root: Path, name: str = "cuda-lib", reason: str = "needs CUDA") -> Path:
    sub = root / name
    sub.mkdir(parents=True)
    (sub / "estimator.py").write_text("x = 1\n")
    (sub / "submission.yaml").write_text(yaml.safe_dump(
        {"name": name, "authors": ["A"], "track": "open", "status": "does-not-run-here",
         "reason": reason, "requirements": ["somelib==1.2.3"]}))
    return sub


def test_an_entry_that_does_not_run_here_is_listed_not_loaded(tmp_path, capsys):
    from benchmark.submissions import find_not_running, verify

    root = tmp_path / "submissions"
    sub = _not_running(root)
    (root / "other").mkdir()
    assert [p.name for p in find_submissions(root)] == ["other"]
    (meta,) = find_not_running(root)
    assert (meta["name"], meta["reason"], meta["requirements"]) == \
        ("cuda-lib", "needs CUDA", ["somelib==1.2.3"])
    with pytest.raises(SubmissionError, match=r"declares status does-not-run-here: it has no "
                                              r"results to load"):
        load_submission(sub)
    # verify lists it with its reason and scores nothing
    assert verify([sub], live_check=False, panel_check=False) == []
    assert "cuda-lib: does not run here (needs CUDA); listed on the board, not scored" in \
        capsys.readouterr().out
    # results beside the status are refused: an entry that does not run has none
    (sub / "results.json").write_text("{}")
    with pytest.raises(SubmissionError, match=r"status does-not-run-here means estimator\.py "
                                              r"\(the glue that was tried\) and no results\.json"):
        find_not_running(root)


def test_the_leaderboard_lists_entries_that_do_not_run_here_with_their_reason(tmp_path):
    from markdown_it import MarkdownIt

    from benchmark.leaderboard import generate

    root = tmp_path / "submissions"
    _not_running(root, "cuda-lib", "ImportError: fast_jl needs CUDA | <b>x</b>")
    _not_running(root, "a-lib", "download at import")
    generate(root, tmp_path / "lb")
    data = json.loads((tmp_path / "lb" / "leaderboard.json").read_text())
    assert [(r["name"], r["reason"], r["requirements"]) for r in data["not_running"]] == [
        ("a-lib", "download at import", ["somelib==1.2.3"]),
        ("cuda-lib", "ImportError: fast_jl needs CUDA | <b>x</b>", ["somelib==1.2.3"])]
    md = (tmp_path / "lb" / "README.md").read_text()
    assert "## Entries that do not run here" in md
    parser = MarkdownIt("commonmark").enable(["table"])
    tokens = parser.parse(md)
    rows = [t for t in tokens if t.type == "tr_open"]
    assert len(rows) == 3  # the header and one row per entry: the | in the reason is escaped
    rendered = parser.render(md)
    assert "ImportError: fast_jl needs CUDA | &lt;b&gt;x&lt;/b&gt;" in rendered
    assert "<b>" not in rendered
    html = (tmp_path / "lb" / "index.html").read_text()
    assert 'id="not-running"' in html and "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x" not in html
