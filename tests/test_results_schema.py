"""A crafted results.json gets a clear refusal, never a traceback (issue 35).

Property-based (hypothesis): a committed ``submissions/tracincp/results.json`` is mutated (keys
deleted, types swapped, deep nesting, huge integers, other scripts' digits, long strings, many
recorded draws) and written out; :func:`benchmark.io.read_json` then
:func:`benchmark.results_schema.check_results_document` either accept it or raise a
:class:`~benchmark.errors.BenchmarkError`, within a second. Every committed results.json is
accepted.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="pip install -e '.[test]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from benchmark.errors import BenchmarkError  # noqa: E402
from benchmark.io import read_json  # noqa: E402
from benchmark.results_schema import (  # noqa: E402
    MAX_RECORDED_DRAWS,
    ResultsSchemaError,
    check_results_document,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "submissions" / "tracincp" / "results.json"

#: stand-ins replaced in the JSON text (json.dumps cannot write these itself)
DEEP = "\x00DEEP\x00"
HUGE = "\x00HUGE\x00"
TEXT_SUBS = {json.dumps(DEEP): "[" * 100_000 + "]" * 100_000,
             json.dumps(HUGE): "7" * 10_000}


@pytest.fixture(scope="module")
def base() -> dict:
    """A committed results.json, with the live block earlier versions recorded (bt-bench no
    longer writes one: an entry's draws are the season panel's, in panel.json; a results file
    that carries one is still checked before anything reads it)."""
    doc = read_json(BASE)
    doc.setdefault("live", {"family_version": "1.0", "scale": "family", "draws": [
        {"draw_id": 1700171876, "run_sha256": "0" * 64, "release": dict(doc["release"]),
         "suite": dict(doc["suite"]), "verdict": doc["verdict"]}]})
    return doc


def _paths(doc) -> list[tuple]:
    """Every path (a tuple of keys/indices) in the document, the root excluded."""
    out, stack = [], [((), doc)]
    while stack:
        path, v = stack.pop()
        if path:
            out.append(path)
        if isinstance(v, dict):
            stack.extend((path + (k,), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((path + (i,), x) for i, x in enumerate(v))
    return sorted(out, key=repr)


#: the fields verify reads first: mutated half the time
FOCUS = [("schema_version",), ("bt_bench_version",), ("release",), ("release", "id"),
         ("release", "manifest_sha256"), ("release", "tasks"), ("estimator",),
         ("estimator", "name"), ("estimator", "sha256"), ("estimator", "track"),
         ("estimator", "tasks"), ("suite",), ("tasks",), ("verdict",), ("live",),
         ("live", "draws"), ("live", "draws", 0), ("live", "draws", 0, "draw_id"),
         ("live", "draws", 0, "suite"), ("tasks", "zorp", "verdict")]

nasty = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0]),
    st.sampled_from(["²", "٧", "７", " 7", "7", "", "x" * 30_000, "0" * 25, "2147483648",
                     DEEP, HUGE]),
    st.text(max_size=30), st.lists(st.integers(), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just({"k" * 300: 1}),
)


@st.composite
def mutations(draw, doc):
    """A list of (op, path, value) edits of ``doc``."""
    paths = _paths(doc)
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            path = draw(st.sampled_from(FOCUS))
        else:
            path = paths[draw(st.integers(0, len(paths) - 1))]
        op = draw(st.sampled_from(["delete", "replace", "many_draws", "wrap"]))
        edits.append((op, path, draw(nasty)))
    return edits


def _apply(doc: dict, edits) -> dict:
    doc = copy.deepcopy(doc)
    for op, path, value in edits:
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            key = path[-1]
            if op == "delete":
                del parent[key]
            elif op == "replace":
                parent[key] = value
            elif op == "wrap":
                parent[key] = [[[[parent[key]]]]]
            elif op == "many_draws" and isinstance(doc.get("live"), dict):
                d0 = (doc["live"].get("draws") or [{}])[0]
                doc["live"]["draws"] = [copy.deepcopy(d0) | {"draw_id": i}
                                        for i in range(MAX_RECORDED_DRAWS + 1 + len(path))]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed the path: nothing to do
    return doc


def _write(doc, path: Path) -> None:
    text = json.dumps(doc, indent=1)
    for stand_in, real in TEXT_SUBS.items():
        text = text.replace(stand_in, real)
    path.write_text(text)


def _accepts_or_refuses_clearly(path: Path) -> str:
    t0 = time.perf_counter()
    try:
        check_results_document(read_json(path), str(path))
        outcome = "accepted"
    except BenchmarkError as exc:
        assert str(path) in str(exc)
        outcome = "refused"
    assert time.perf_counter() - t0 < 1.0, "took over a second"
    return outcome


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_results_are_accepted_or_refused_clearly(base, tmp_path_factory, data):
    edits = data.draw(mutations(base))
    path = tmp_path_factory.mktemp("mut") / "results.json"
    _write(_apply(base, edits), path)
    _accepts_or_refuses_clearly(path)


def test_every_committed_results_file_is_accepted():
    files = sorted((ROOT / "submissions").glob("*/results.json"))
    assert len(files) >= 10
    for f in files:
        check_results_document(read_json(f), str(f))


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.pop("estimator"), r"estimator is nothing \(the key is missing\); expected an "
                                   r"object: regenerate the file with bt-bench submit --force"),
    (lambda d: d.__setitem__("schema_version", True), r"schema_version is the boolean true; "
                                                       r"expected an integer"),
    (lambda d: d["release"].__setitem__("manifest_sha256", "ab"),
     r"release\.manifest_sha256 is str 'ab'; expected a sha256"),
    (lambda d: d["live"]["draws"][0].__setitem__("draw_id", "٧"),
     r"live\.draws\[0\]\.draw_id: live draw id '٧' is not valid; expected an integer in "
     r"\[0, 2147483648\) written in ASCII digits"),
    (lambda d: d["live"]["draws"][0].__setitem__("draw_id", " 7"),
     r"live\.draws\[0\]\.draw_id: live draw id ' 7' is not valid"),
    (lambda d: d["live"].__setitem__("draws", d["live"]["draws"] * 10_000),
     r"live\.draws records 10000 draws; at most 8 \(the panel's draws and the fresh one\)"),
    (lambda d: d["tasks"]["zorp"]["summary"].__setitem__("x", float("nan")),
     r"tasks\.zorp\.summary\.x is nan; expected a finite number"),
    (lambda d: d["estimator"].__setitem__("name", "n" * 30_000),
     r"estimator\.name is a string of 30000 characters; at most 20000"),
    (lambda d: d["suite"].__setitem__("big", 10**5000),
     r"suite\.big is an integer of 16610 bits; expected one within 64 bits"),
], ids=["no-estimator", "bool-version", "short-sha", "arabic-digit", "space-digit",
        "10000-draws", "nan", "long-string", "huge-int"])
def test_crafted_fields_are_refused_by_json_path(base, edit, match):
    doc = copy.deepcopy(base)
    edit(doc)
    t0 = time.perf_counter()
    with pytest.raises(ResultsSchemaError, match=r"^where: " + match):
        check_results_document(doc, "where")
    assert time.perf_counter() - t0 < 1.0


def test_a_deep_list_in_a_parsed_document_is_refused_without_recursion(base):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    doc = copy.deepcopy(base) | {"suite": {"x": deep}}
    with pytest.raises(ResultsSchemaError, match=r"suite\.x\[0\].* nested 33 levels deep; "
                                                 r"at most 32"):
        check_results_document(doc, "where")


@pytest.mark.parametrize("text", ['{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                  '{"live": {"draws": [{"draw_id": ' + "7" * 10_000 + "}]}}"],
                         ids=["100000-deep", "10000-digit-draw-id"])
def test_the_issue_crafted_files_give_clear_errors_within_a_second(tmp_path, text):
    p = tmp_path / "results.json"
    p.write_text(text)
    assert _accepts_or_refuses_clearly(p) == "refused"
