"""The structure of a ``results.json``, checked before anything reads it (issue 35).

A committed ``results.json`` comes with a pull request: anyone may have written it. ``verify``,
``load_submission`` and the leaderboard index into it, rebuild the live draws it records and
compare numbers; a crafted file must be refused up front with an error that names the field, not
crash them deep inside (a ``KeyError``, a ``RecursionError``, a 10,000-digit draw id) or make
them build thousands of draws. :func:`check_results_document` is pure (no I/O, no imports of the
evaluator) and walks the document without recursion, in time linear in its size.

What it checks (the keys that ``benchmark.evaluate._results_document`` writes and verify reads):

* the top level is an object with ``schema_version`` (int), ``bt_bench_version`` (str),
  ``release`` ({``id``: str, ``manifest_sha256``: 64 hex digits, ``tasks``: [str], ...}),
  ``estimator`` ({``name``, ``class``, ``track``: str, ``sha256``: 64 hex digits,
  ``tasks``: [str], ...}), ``tasks`` ({task: {``verdict``: str, ...}}), ``suite`` (object) and
  ``verdict`` (str); the optional ``requirements``, ``controls`` (lists), ``isolation``,
  ``settings``, ``packages`` (objects) have those types;
* ``live``, when present: an object whose ``draws`` is a list of at most
  :data:`MAX_RECORDED_DRAWS` objects, each with a ``draw_id`` that
  :func:`benchmark.live.check_draw_id` accepts (an int, or a string of ASCII digits, in
  ``[0, 2**31)``), and ``release``/``suite`` objects, ``run_sha256`` and ``verdict`` strings;
* everywhere: numbers finite and integers within 64 bits, booleans not where a number or string
  is required, strings at most :data:`MAX_STRING_CHARS` characters, keys strings of at most
  :data:`MAX_KEY_CHARS`, at most :data:`MAX_DEPTH` levels and :data:`MAX_NODES` values.
"""

from __future__ import annotations

import math
import re
from typing import Any

from benchmark.errors import InputFileError

#: the most live draws a results.json may record: the panel's size plus the fresh draw
MAX_RECORDED_DRAWS = 8
#: the longest string value (bt-bench's longest, a protection's description, is ~3,500)
MAX_STRING_CHARS = 20_000
#: the longest object key (bt-bench's longest is under 50)
MAX_KEY_CHARS = 200
#: the deepest nesting of objects/arrays (bt-bench's files reach 11)
MAX_DEPTH = 32
#: the most values in one document (bt-bench's files hold about 25,000)
MAX_NODES = 1_000_000
#: integers are within a signed 64-bit range
MAX_INT = 2**63

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_REGENERATE = "regenerate the file with bt-bench submit --force"


class ResultsSchemaError(InputFileError):
    """A results.json's structure is not one bt-bench writes (names the JSON path)."""


def check_results_document(doc: Any, where: str) -> None:
    """Refuse a results document whose structure is not one bt-bench writes.

    Args:
        doc: the parsed document (``benchmark.io.read_json`` of a results.json).
        where: the file, for messages.

    Raises:
        ResultsSchemaError: naming ``where``, the JSON path of the first bad field (e.g.
            ``live.draws[2].draw_id``), what was found, what was expected and the fix.
    """
    _check_tree(doc, where)
    _need(doc, "", dict, "an object", where)
    for key, typ, what in _TOP:
        _need(doc.get(key, _MISSING), key, typ, what, where)
    for key, typ, what in _TOP_OPTIONAL:
        if key in doc:
            _need(doc[key], key, typ, what, where)
    rel, est = doc["release"], doc["estimator"]
    for key, typ, what in (("id", str, "a string"), ("manifest_sha256", str, "64 hex digits"),
                           ("tasks", list, "a list of task names")):
        _need(rel.get(key, _MISSING), f"release.{key}", typ, what, where)
    _hex64(rel["manifest_sha256"], "release.manifest_sha256", where)
    _strings(rel["tasks"], "release.tasks", where)
    for key, typ, what in (("name", str, "a string"), ("class", str, "a string"),
                           ("track", str, "a string"), ("sha256", str, "64 hex digits"),
                           ("tasks", list, "a list of task names")):
        _need(est.get(key, _MISSING), f"estimator.{key}", typ, what, where)
    _hex64(est["sha256"], "estimator.sha256", where)
    _strings(est["tasks"], "estimator.tasks", where)
    if "controls" in doc:
        _strings(doc["controls"], "controls", where)
    for name, task in doc["tasks"].items():
        _need(task, f"tasks.{name}", dict, "an object", where)
        _need(task.get("verdict", _MISSING), f"tasks.{name}.verdict", str, "a string", where)
    if "live" in doc:
        _check_live(doc["live"], where)


def _check_live(live: Any, where: str) -> None:
    from benchmark.errors import BuildError
    from benchmark.live import check_draw_id

    _need(live, "live", dict, "an object", where)
    draws = live.get("draws", _MISSING)
    _need(draws, "live.draws", list, "a list of recorded draws", where)
    if len(draws) > MAX_RECORDED_DRAWS:
        raise ResultsSchemaError(
            f"{where}: live.draws records {len(draws)} draws; at most {MAX_RECORDED_DRAWS} (the "
            f"panel's draws and the fresh one) are verified: {_REGENERATE}.")
    for i, d in enumerate(draws):
        at = f"live.draws[{i}]"
        _need(d, at, dict, "an object", where)
        raw = d.get("draw_id", _MISSING)
        if raw is _MISSING:
            _need(raw, f"{at}.draw_id", int, "a draw id", where)
        try:
            check_draw_id(raw)
        except BuildError as exc:
            raise ResultsSchemaError(f"{where}: {at}.draw_id: {exc}; {_REGENERATE}.") from None
        for key, typ, what in (("release", dict, "an object"), ("suite", dict, "an object"),
                               ("run_sha256", str, "a string"), ("verdict", str, "a string")):
            if key in d:
                _need(d[key], f"{at}.{key}", typ, what, where)


_MISSING = object()

#: (key, type, what) of the top level's required and optional fields
_TOP = (("schema_version", int, "an integer"), ("release", dict, "an object"),
        ("estimator", dict, "an object"), ("tasks", dict, "an object of tasks"),
        ("suite", dict, "an object"), ("verdict", str, "a string"))
_TOP_OPTIONAL = (("bt_bench_version", str, "a string"), ("requirements", list, "a list"),
                 ("controls", list, "a list"), ("isolation", dict, "an object"),
                 ("settings", dict, "an object"), ("packages", dict, "an object"))


def _kind(v: Any) -> str:
    if v is _MISSING:
        return "nothing (the key is missing)"
    if isinstance(v, bool):
        return f"the boolean {str(v).lower()}"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, int) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"  # repr() refuses over 4,300 digits
    r = repr(v)
    return f"{type(v).__name__} {r[:40] + '...' if len(r) > 40 else r}"


def _need(v: Any, path: str, typ: type, what: str, where: str) -> None:
    if v is _MISSING or isinstance(v, bool) or not isinstance(v, typ):
        raise ResultsSchemaError(f"{where}: {path or 'the top level'} is {_kind(v)}; expected "
                                 f"{what}: {_REGENERATE}.")


def _hex64(v: str, path: str, where: str) -> None:
    if not _HEX64.match(v):
        raise ResultsSchemaError(f"{where}: {path} is {_kind(v)}; expected a sha256 (64 "
                                 f"lowercase hex digits): {_REGENERATE}.")


def _strings(v: list, path: str, where: str) -> None:
    for i, s in enumerate(v):
        _need(s, f"{path}[{i}]", str, "a string", where)


def _check_tree(doc: Any, where: str) -> None:
    """Every value: finite numbers, 64-bit ints, bounded strings, keys, depth and size."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    nodes = 0
    while stack:
        v, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ResultsSchemaError(f"{where}: more than {MAX_NODES} values; bt-bench's "
                                     f"results hold far fewer: {_REGENERATE}.")
        if depth > MAX_DEPTH:
            raise ResultsSchemaError(f"{where}: {path} is nested {depth} levels deep; at most "
                                     f"{MAX_DEPTH}: {_REGENERATE}.")
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str) or len(k) > MAX_KEY_CHARS:
                    shown = repr(k)[:40]
                    raise ResultsSchemaError(
                        f"{where}: {path or 'the top level'} has the key {shown} of "
                        f"{len(str(k))} characters; keys are strings of at most "
                        f"{MAX_KEY_CHARS}: {_REGENERATE}.")
                stack.append((x, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, str):
            if len(v) > MAX_STRING_CHARS:
                raise ResultsSchemaError(f"{where}: {path} is a string of {len(v)} characters; "
                                         f"at most {MAX_STRING_CHARS}: {_REGENERATE}.")
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if not -MAX_INT <= v < MAX_INT:
                raise ResultsSchemaError(f"{where}: {path} is an integer of {v.bit_length()} "
                                         f"bits; expected one within 64 bits: "
                                         f"{_REGENERATE}.")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ResultsSchemaError(f"{where}: {path} is {v!r}; expected a finite number "
                                         f"(bt-bench writes null for a missing one): "
                                         f"{_REGENERATE}.")
        else:
            raise ResultsSchemaError(f"{where}: {path} is a {type(v).__name__}; expected JSON "
                                     f"values only: {_REGENERATE}.")


__all__ = ["MAX_RECORDED_DRAWS", "ResultsSchemaError", "check_results_document"]
