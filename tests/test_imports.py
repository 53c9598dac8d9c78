"""Arrows one way: no import circles in benchmark/ and estimators/, and each subpackage's rules.

Pure ``ast``: nothing here imports the modules it reads. Every ``import`` and ``from ... import``
counts, at module level or inside a function (a lazy import is still an arrow), relative ones
resolved; ``from pkg import name`` is an arrow to ``pkg.name`` when that is a module, else to
``pkg`` (its ``__init__``). Importing ``a.b.c`` is an arrow to the module ``a.b.c`` only.

The subpackage rules are read from the ``__init__`` docstrings of ``benchmark/sandbox``,
``benchmark/causal`` and ``benchmark/releases``: their "May import:" paragraph (the modules named
with ``:mod:``) and their "Must never:" paragraph (the subsystems it names).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("benchmark", "estimators")

#: the subpackages whose ``__init__`` docstrings state what they may and must never import
RULED = ("benchmark.sandbox", "benchmark.causal", "benchmark.releases")

#: the subsystems a "Must never:" paragraph names, and their modules
SUBSYSTEMS = {
    "the sandbox": "benchmark.sandbox",
    "the evaluator": "benchmark.evaluate",
    "the causal score": "benchmark.causal",
    "the leaderboard": "benchmark.leaderboard",
}

#: the sandbox's inside: the sandboxed child (it runs estimator code), the last trusted step
#: before bubblewrap and the pieces only they use; only isolation, layers and requirements are
#: called from outside ("Nothing outside this package spawns estimator code")
SANDBOX_INSIDE = ("child", "_launch", "seccomp", "cgroups", "channel", "view_io")


def _modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of the packages."""
    out = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = p.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _absolute(name: str | None, module: str, level: int, is_package: bool) -> str:
    """The absolute module of ``from <level dots><name> import ...`` written in ``module``."""
    if not level:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict) -> list[str]:
    """The module names an import statement points at (before trimming to known modules)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node.module, module, node.level, is_package)
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    return []


@functools.cache
def import_graph(root: Path = ROOT) -> dict[str, frozenset[str]]:
    """Module -> the modules of the packages it imports (anywhere in its file)."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        arrows = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for t in _targets(node, name, is_package, modules):
                while t and t not in modules:  # an attribute of a module: the module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    arrows.add(t)
        graph[name] = frozenset(arrows)
    return graph


def strongly_connected(graph: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def _path(graph: dict, start: str, goal, allowed=None) -> list[str] | None:
    """A shortest import chain from ``start`` to a module for which ``goal(module)`` holds."""
    prev: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if allowed is not None and w not in allowed:
                continue
            if goal(w):
                chain = [w, v]
                while prev[chain[-1]] is not None:
                    chain.append(prev[chain[-1]])
                return chain[::-1]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def cycle_path(graph: dict, comp: frozenset[str]) -> str:
    """One circle through the component, as ``a -> b -> a``."""
    start = min(comp)
    return " -> ".join(_path(graph, start, lambda m: m == start, comp))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _docstring(package: str) -> str:
    return ast.get_docstring(ast.parse(_modules(ROOT)[package].read_text())) or ""


def _paragraph(doc: str, head: str) -> str:
    """The paragraph of ``doc`` that starts with ``head`` (e.g. ``"May import:"``), one line."""
    for para in re.split(r"\n\s*\n", doc):
        if para.lstrip().startswith(head):
            return " ".join(para.split())
    return ""


def may_import(package: str) -> list[str]:
    """The modules a subpackage's docstring allows it to import (its "May import:" paragraph)."""
    return re.findall(r":mod:`([\w.]+)`", _paragraph(_docstring(package), "May import:"))


def must_never(package: str) -> list[str]:
    """The subsystems a subpackage's docstring forbids (its "Must never:" paragraph)."""
    para = _paragraph(_docstring(package), "Must never:")
    return [mod for words, mod in SUBSYSTEMS.items() if words in para]


def _arrows_outside(package: str) -> set[tuple[str, str]]:
    """(module inside ``package``, module outside it) for every arrow that leaves the package."""
    graph = import_graph()
    return {(m, t) for m in graph if _inside(m, package)
            for t in graph[m] if not _inside(t, package)}


# ----------------------------------------------------------------------------------------------
# circles


def test_the_walk_sees_lazy_relative_and_from_imports(tmp_path):
    """The graph counts function-level imports, resolves relative ones, and maps ``from``."""
    pkg = tmp_path / "benchmark"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "estimators").mkdir()
    (pkg / "__init__.py").write_text('"""root."""\n')
    (pkg / "sub" / "__init__.py").write_text("from benchmark.sub.a import X\n")
    (pkg / "sub" / "a.py").write_text("X = 1\n\ndef f():\n    from . import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import errors\nfrom benchmark.sub import X\n")
    (pkg / "errors.py").write_text("import benchmark.sub.a.X\n")
    graph = import_graph(tmp_path)
    assert graph["benchmark.sub"] == {"benchmark.sub.a"}
    assert graph["benchmark.sub.a"] == {"benchmark.sub.b"}  # lazy, relative, a submodule
    assert graph["benchmark.sub.b"] == {"benchmark.errors", "benchmark.sub"}  # X: the package
    assert graph["benchmark.errors"] == {"benchmark.sub.a"}  # an attribute: its module
    comps = strongly_connected(graph)
    assert comps == [frozenset({"benchmark.sub", "benchmark.sub.a", "benchmark.sub.b",
                                "benchmark.errors"})]
    assert cycle_path(graph, comps[0]).split(" -> ")[0] == "benchmark.errors"


def test_no_import_cycles():
    """No module reaches itself through imports."""
    graph = import_graph()
    bad = strongly_connected(graph)
    assert not bad, (
        "import circles (a lower module should take what it needs as an argument or from a "
        "small shared module it and the higher one both import):\n"
        + "\n".join(f"  {cycle_path(graph, c)}   (circle of {sorted(c)})" for c in bad))


# ----------------------------------------------------------------------------------------------
# the subpackages' rules


@pytest.mark.parametrize("package", RULED)
def test_subpackage_init_imports_nothing(package):
    """The ``__init__.py`` is its docstring only (importing the package stays cheap)."""
    path = _modules(ROOT)[package]
    body = ast.parse(path.read_text()).body
    extra = [f"line {n.lineno}: {ast.unparse(n)[:60]}" for n in body[1:]]
    assert body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str), f"{path} has no docstring first"
    assert not extra, f"{path} must hold its docstring only; it also has {extra}"


def test_root_packages_import_nothing():
    """``benchmark`` and ``estimators`` import no module (so any module may import them)."""
    graph = import_graph()
    assert {p: sorted(graph[p]) for p in PACKAGES if graph[p]} == {}


@pytest.mark.parametrize("package", RULED)
def test_subpackage_imports_only_what_it_may(package):
    """Every arrow leaving the subpackage goes to a module its "May import:" paragraph names."""
    allowed = may_import(package)
    assert allowed, f"{package}'s __init__ docstring has no 'May import:' paragraph"
    bad = sorted((m, t) for m, t in _arrows_outside(package)
                 if t not in PACKAGES and not any(_inside(t, a) for a in allowed))
    assert not bad, (f"{package} may import {allowed} (its __init__ docstring), but: "
                     + "; ".join(f"{m} -> {t}" for m, t in bad))


@pytest.mark.parametrize("package", RULED)
def test_subpackage_never_reaches_what_it_must_not(package):
    """No chain of imports leads from the subpackage to a subsystem its "Must never:" names."""
    forbidden = must_never(package)
    assert forbidden, f"{package}'s __init__ docstring names nothing under 'Must never:'"
    graph = import_graph()
    chains = []
    for m in sorted(graph):
        if _inside(m, package):
            chain = _path(graph, m, lambda t: any(_inside(t, f) for f in forbidden))
            if chain:
                chains.append(" -> ".join(chain))
    assert not chains, (f"{package} must never import {forbidden} (its __init__ docstring), "
                        "directly or through another module:\n  " + "\n  ".join(chains))


def test_nothing_outside_the_sandbox_uses_its_inside():
    """Outside ``benchmark/sandbox/``, no import of its inside and no ``-m`` of its child."""
    graph = import_graph()
    inside = {f"benchmark.sandbox.{n}" for n in SANDBOX_INSIDE}
    assert inside <= set(graph), sorted(inside - set(graph))  # the list names real modules
    bad = sorted(f"{m} -> {t}" for m in graph if not _inside(m, "benchmark.sandbox")
                 for t in graph[m] if t in inside)
    for m, path in _modules(ROOT).items():
        if _inside(m, "benchmark.sandbox"):
            continue
        nodes = list(ast.walk(ast.parse(path.read_text())))
        prose = {id(n.value) for n in nodes if isinstance(n, ast.Expr)}  # docstrings
        bad += [f"{m} names benchmark.sandbox.child (line {n.lineno})" for n in nodes
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and id(n) not in prose and "benchmark.sandbox.child" in n.value]
    assert not bad, ("only the sandbox runs estimator code; outside it use isolation, layers "
                     "and requirements:\n  " + "\n  ".join(bad))
