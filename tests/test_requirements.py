"""Declared requirements: parsing, per-submission environments, their smoke test and the cache.

Installs use small wheels built here (``--no-index --find-links``), so they run offline; one test
installs a real wheel from PyPI and skips when PyPI cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import site
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from benchmark.sandbox import requirements as R
from benchmark.sandbox.isolation import inspect_isolated
from benchmark.sandbox.requirements import (
    CORE_PACKAGES,
    RequirementError,
    SubmissionEnv,
    ensure_env,
    parse_requirements,
    refuse_in_process,
)
from benchmark.submissions import (
    ALLOWED_KEYS,
    SubmissionError,
    VerifyReport,
    _dump_metadata,
    _failure_fix,
    load_submission,
    validate_metadata,
)
from tests.wheels import build_wheel, offline

# ----------------------------------------------------------------------------------------------
# parsing


def test_parse_returns_canonical_pins_in_order():
    assert parse_requirements(["Opt_Einsum==3.4.0", "kronfluence == 1.0.1", "a.b-c==2.0rc1"]) \
        == ["opt-einsum==3.4.0", "kronfluence==1.0.1", "a-b-c==2.0rc1"]
    assert parse_requirements(None) == []
    assert parse_requirements([]) == []


@pytest.mark.parametrize("value, message", [
    ("kronfluence==1.0.1", r"must be a list of exact pins name==version"),
    ([1], r"must be a list of exact pins"),
    (["kronfluence>=1.0"], r"'kronfluence>=1.0' is not an exact pin \(it does not pin an exact "
                           r"version with ==\); expected name==version"),
    (["kronfluence"], r"does not pin an exact version"),
    (["kronfluence==1.*"], r"wildcards and version ranges are not allowed"),
    (["kronfluence==1.0,<2"], r"wildcards and version ranges"),
    (["kronfluence==one"], r"'one' is not a valid version \(PEP 440\)"),
    (["kronfluence @ https://example.org/k.whl"], r"URLs, paths, files and pip options"),
    (["--index-url=https://example.org"], r"URLs, paths, files and pip options"),
    (["./kronfluence-1.0.1-py3-none-any.whl"], r"URLs, paths, files and pip options"),
    (["kronfluence[dev]==1.0.1"], r"extras are not allowed"),
    (["kronfluence==1.0.1; python_version > '3'"], r"environment markers are not allowed"),
    (["-bad-==1.0"], r"pip options"),
    (["b@d==1.0"], r"URLs"),
    ([""], r"it is empty"),
    (["einops==0.8.2", "EINOPS==0.8.1"], r"'EINOPS==0.8.1' names einops again \(already "
                                         r"'einops==0.8.2'\); list each package once"),
    (["torch==2.4.0"], r"'torch==2.4.0' names torch, which the core environment provides .*"
                       r"remove it from requirements"),
    (["Scikit_Learn==1.5.0"], r"names scikit-learn, which the core environment provides"),
    (["bt-bench==0.1.0"], r"names bt-bench, which the core environment provides"),
])
def test_parse_errors_name_value_form_and_fix(value, message):
    with pytest.raises(RequirementError, match=message):
        parse_requirements(value, "x.yaml")


def test_every_core_package_is_refused():
    for name in CORE_PACKAGES:
        with pytest.raises(RequirementError, match="core environment provides"):
            parse_requirements([f"{name}==1.0"])


def test_submission_yaml_accepts_requirements_after_the_metadata_and_round_trips():
    # requirements follow what a person writes; cost and frozen (written by submit) come last
    assert ALLOWED_KEYS[-4:] == ("requirements", "build_from_sdist", "cost", "frozen")
    meta = validate_metadata({"name": "k", "authors": ["A"], "track": "open",
                              "requirements": ["Opt_Einsum==3.4.0"]})
    assert meta["requirements"] == ["opt-einsum==3.4.0"]
    assert list(yaml.safe_load(_dump_metadata(meta))) == ["name", "authors", "track", "kind",
                                                          "requirements"]
    assert "requirements" not in validate_metadata({"name": "k", "authors": ["A"],
                                                    "track": "open", "requirements": []})
    with pytest.raises(SubmissionError, match=r"'torch==2\.4\.0' names torch"):
        validate_metadata({"name": "k", "authors": ["A"], "track": "open",
                           "requirements": ["torch==2.4.0"]})


def test_the_kronfluence_submission_declares_a_valid_lock():
    meta = yaml.safe_load((Path(__file__).parents[1] / "submissions" / "kronfluence-ekfac"
                           / "submission.yaml").read_text())
    pins = parse_requirements(meta["requirements"])
    names = [p.split("==")[0] for p in pins]
    assert names[0] == "kronfluence" and "torchvision" not in names
    assert not set(names) & set(R.core_closure())  # nothing the core already provides


def test_core_closure_holds_core_dependencies():
    closure = R.core_closure()
    assert closure["torch"] == "torch"
    assert closure["packaging"] in CORE_PACKAGES  # a dependency of transformers and others


# ----------------------------------------------------------------------------------------------
# environments (offline wheels built here)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    build_wheel(d, "btb-fixture-ok", "1.0", {"btb_fixture_ok/__init__.py": "VALUE = 42\n"})
    build_wheel(d, "btb-fixture-needs", "1.0",
                {"btb_fixture_needs.py": "import btb_fixture_missing_dep\n"})
    build_wheel(d, "btb-fixture-shadow", "1.0",
                {"tqdm/__init__.py": "raise ImportError('shadow')\n"})
    # like torchvision 0.28.0 on this CPU torch: transformers imports it while loading a model
    build_wheel(d, "torchvision", "0.28.99", {"torchvision/__init__.py": (
        "raise RuntimeError('operator torchvision::nms does not exist')\n")})
    return d


def _leftovers(cache: Path) -> list[str]:
    """The cached environments (each one's seal, ``<key>.seal``, beside it is not counted)."""
    envs = cache / "envs"
    return sorted(p.name for p in envs.iterdir() if not p.name.endswith(".seal")) \
        if envs.is_dir() else []


@pytest.fixture(scope="module")
def ok_env(tmp_path_factory, wheels) -> tuple[SubmissionEnv, Path]:
    cache = tmp_path_factory.mktemp("cache")
    env = ensure_env(["BTB_fixture_ok==1.0"], cache=cache, pip_args=offline(wheels))
    return env, cache


def inside(env: SubmissionEnv, tmp_path: Path, expr: str) -> str:
    """``expr`` evaluated in the environment's interpreter, in the estimator sandbox.

    The expression becomes a probe estimator's declared name (what ``inspect_isolated`` returns):
    nothing of the environment runs in this process.
    """
    est = tmp_path / "probe.py"
    est.write_text("import numpy as np\nfrom estimators.base import BaseEstimator\n\n\n"
                   f"class Probe(BaseEstimator):\n    name = str({expr})[:64]\n\n"
                   "    def score_rollouts(self, view):\n        return np.zeros(view.n)\n")
    return inspect_isolated(est, **env.sandbox_kwargs())["name"]


def test_install_records_versions_and_shares_the_core(ok_env, wheels, tmp_path):
    env, cache = ok_env
    assert env.requirements == ("btb-fixture-ok==1.0",)
    assert env.record() == [{"name": "btb-fixture-ok", "version": "1.0"}]
    # its build time (install, checks, sandboxed smoke test), recorded in its marker
    assert 0 < env.build_seconds < 600
    assert json.loads((env.prefix / R.MARKER).read_text())["build_seconds"] == env.build_seconds
    assert env.prefix.parent == cache / "envs" and env.prefix.name == R.env_key(
        ["btb-fixture-ok==1.0"], offline(wheels))
    # what the sandbox binds depends on how bt-bench itself is installed: from the system
    # interpreter (CI) only the environment; from a virtual environment (the README followed in
    # a venv) also that venv's site folders, which hold the core (torch) and which the new
    # environment's --system-site-packages cannot see (they are not the base interpreter's)
    base = set(site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]))
    core = [d for d in site.getsitepackages() if d not in base and Path(d).is_dir()]
    assert bool(core) == (sys.prefix != sys.base_prefix), (sys.prefix, sys.base_prefix, core)
    assert env.sandbox_kwargs() == {"python": str(env.prefix / "bin" / "python"),
                                    "extra_read_only": [str(env.prefix), *core]}
    whl = wheels / "btb_fixture_ok-1.0-py3-none-any.whl"
    assert env.wheels == ((whl.name, hashlib.sha256(whl.read_bytes()).hexdigest()),)
    value, torch_file = inside(
        env, tmp_path, "f'{__import__(\"btb_fixture_ok\").VALUE} {__import__(\"torch\").__file__}'"
    ).split(" ", 1)
    assert value == "42"
    assert not torch_file.startswith(str(env.prefix))  # torch comes from bt-bench's interpreter
    with pytest.raises(ImportError):  # and the requirement did not reach bt-bench's interpreter
        __import__("btb_fixture_ok")
    assert _leftovers(cache) == [env.prefix.name]
    modes = {p.stat().st_mode & 0o777 for p in env.prefix.rglob("*") if not p.is_symlink()}
    assert modes <= {0o755, 0o644}  # readable by the sandbox's uid, writable by the owner only


def test_a_cached_environment_is_reused_without_pip(ok_env, wheels, monkeypatch):
    env, cache = ok_env

    def no_subprocess(*a, **k):
        raise AssertionError("pip or the smoke test ran for a cached environment")

    monkeypatch.setattr(R.subprocess, "run", no_subprocess)
    again = ensure_env(["btb-fixture-ok==1.0"], cache=cache, pip_args=offline(wheels))
    assert again == env


def _count_subprocesses(monkeypatch) -> list:
    """Record the argv of every ``subprocess.run`` the requirements module makes (still run)."""
    calls = []
    real = R.subprocess.run

    def counting(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(R.subprocess, "run", counting)
    return calls


def test_a_damaged_environment_is_rebuilt(tmp_path, wheels, monkeypatch):
    env = ensure_env(["btb-fixture-ok==1.0"], cache=tmp_path, pip_args=offline(wheels))
    (env.prefix / R.MARKER).unlink()  # e.g. an install that was interrupted before the end
    calls = _count_subprocesses(monkeypatch)
    again = ensure_env(["btb-fixture-ok==1.0"], cache=tmp_path, pip_args=offline(wheels))
    assert any("pip" in c for c in calls)
    assert (again.prefix / R.MARKER).is_file() and _leftovers(tmp_path) == [again.prefix.name]


def test_an_environment_edited_in_place_or_sealed_elsewhere_is_rebuilt(tmp_path, wheels,
                                                                        monkeypatch):
    """Issue 39: an installed environment is bound to this machine's key by a seal over every
    file; a library file edited after the install (what would change an entry's scores from the
    cache), or an environment brought from another machine's cache, is reinstalled."""
    from benchmark.seal import KEY_ENV

    env = ensure_env(["btb-fixture-ok==1.0"], cache=tmp_path, pip_args=offline(wheels))
    assert (tmp_path / "envs" / f"{env.prefix.name}.seal").is_file()
    mod = next(env.prefix.rglob("btb_fixture_ok/__init__.py"))
    mod.write_text(mod.read_text().replace("42", "43"))
    calls = _count_subprocesses(monkeypatch)
    again = ensure_env(["btb-fixture-ok==1.0"], cache=tmp_path, pip_args=offline(wheels))
    assert any("pip" in c for c in calls)
    assert "42" in next(again.prefix.rglob("btb_fixture_ok/__init__.py")).read_text()
    calls.clear()
    assert ensure_env(["btb-fixture-ok==1.0"], cache=tmp_path, pip_args=offline(wheels)) == again
    assert not calls  # sealed: reused as it is
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "other.key"))  # another machine's key
    ensure_env(["btb-fixture-ok==1.0"], cache=tmp_path, pip_args=offline(wheels))
    assert any("pip" in c for c in calls)


def test_an_uninstallable_pin_is_a_clear_error_and_leaves_nothing(tmp_path, wheels):
    with pytest.raises(RequirementError, match=r"(?s)x\.yaml: requirement 'btb-fixture-ok==9\.9'"
                       r" cannot be installed: pip failed:.*No matching distribution.*"
                       r"fix: pin a version that exists on PyPI as a wheel"):
        ensure_env(["btb-fixture-ok==9.9"], cache=tmp_path, pip_args=offline(wheels),
                   where="x.yaml")
    assert _leftovers(tmp_path) == []


def test_a_requirement_that_breaks_transformers_is_named(tmp_path, wheels):
    with pytest.raises(RequirementError, match=r"(?s)requirement 'torchvision==0\.28\.99' breaks "
                       r"transformers \(it works without the requirements\): load a Qwen2 model "
                       r"with AutoModelForCausalLM failed.*operator torchvision::nms does not "
                       r"exist.*fix: pin a version of it that works with the core environment"):
        ensure_env(["torchvision==0.28.99"], cache=tmp_path, pip_args=offline(wheels))
    assert _leftovers(tmp_path) == []


def test_a_missing_dependency_of_a_requirement_says_to_pin_it(tmp_path, wheels):
    with pytest.raises(RequirementError, match=r"(?s)requirement 'btb-fixture-needs==1\.0' "
                       r"installs but importing btb_fixture_needs fails:.*No module named "
                       r"'btb_fixture_missing_dep'.*add the package that provides "
                       r"'btb_fixture_missing_dep' as an exact pin"):
        ensure_env(["btb-fixture-needs==1.0"], cache=tmp_path, pip_args=offline(wheels))
    assert _leftovers(tmp_path) == []


def test_a_requirement_cannot_shadow_a_core_module(tmp_path, wheels):
    with pytest.raises(RequirementError, match=r"'btb-fixture-shadow==1\.0' installs the "
                       r"module\(s\) tqdm, which belong to the core environment"):
        ensure_env(["btb-fixture-shadow==1.0"], cache=tmp_path, pip_args=offline(wheels))
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("path, file", [
    ("btb_own-1.0.data/data/pyvenv.cfg", "pyvenv.cfg"),
    ("btb_own-1.0.data/scripts/python", "bin/python"),
])
def test_a_wheel_cannot_replace_the_environments_own_files(tmp_path, path, file):
    """A pyvenv.cfg of the wheel's would choose what the sandbox binds for the interpreter
    (``home = /root/.ssh/bin`` would bind /root/.ssh); a bin/python what the sandbox runs."""
    build_wheel(tmp_path / "w", "btb-own", "1.0",
                {"btb_own.py": "", path: "home = /root/.ssh/bin\n"})
    with pytest.raises(RequirementError, match=rf"requirement 'btb-own==1\.0' installs {file} "
                       r"over the environment's own file .* drop the requirement"):
        ensure_env(["btb-own==1.0"], cache=tmp_path / "cache", pip_args=offline(tmp_path / "w"))
    assert _leftovers(tmp_path / "cache") == []


def test_a_wheel_carrying_another_packages_metadata_is_refused(tmp_path):
    build_wheel(tmp_path / "w", "btb-two", "1.0", {"btb_two.py": ""})
    # pip refuses a second dist-info at the wheel's top; through .data/purelib it installs
    build_wheel(tmp_path / "w", "btb-carrier", "1.0", {
        "btb_carrier.py": "",
        "btb_carrier-1.0.data/purelib/BTB_TWO-6.6.dist-info/METADATA":
            "Name: btb-two\nVersion: 6.6\n"})
    with pytest.raises(RequirementError, match=r"install 2 metadata folders for btb-two "
                       r"\(BTB_TWO-6\.6\.dist-info, btb_two-1\.0\.dist-info\)"):
        ensure_env(["btb-carrier==1.0", "btb-two==1.0"], cache=tmp_path / "cache",
                   pip_args=offline(tmp_path / "w"))


def test_the_same_pin_from_another_source_gets_its_own_environment(tmp_path):
    """A wheel from a local folder (a test's, or a forged one) never stands in for the index's:
    where pip takes wheels from is part of the cache key, and the marker records each wheel's
    sha256."""
    real, forged = tmp_path / "real", tmp_path / "forged"
    build_wheel(real, "btb-same", "1.0", {"btb_same.py": "WHO = 'real'\n"})
    build_wheel(forged, "btb-same", "1.0", {"btb_same.py": "WHO = 'forged'\n"})
    cache = tmp_path / "cache"
    a = ensure_env(["btb-same==1.0"], cache=cache, pip_args=offline(real))
    b = ensure_env(["btb-same==1.0"], cache=cache, pip_args=offline(forged))
    assert a.prefix != b.prefix and a.wheels[0][1] != b.wheels[0][1]
    assert "real" in next((a.prefix / "lib").rglob("btb_same.py")).read_text()
    assert "forged" in next((b.prefix / "lib").rglob("btb_same.py")).read_text()
    assert ensure_env(["btb-same==1.0"], cache=cache, pip_args=offline(real)) == a
    assert R.package_source(offline(real)) != R.package_source(offline(forged))


def test_a_dependency_of_the_core_cannot_be_pinned(tmp_path):
    with pytest.raises(RequirementError, match=r"'packaging==24\.0' names packaging, which is "
                       r"installed as part of bt-bench's core environment \(a dependency of "):
        ensure_env(["packaging==24.0"], cache=tmp_path)
    assert _leftovers(tmp_path) == []


def test_no_requirements_means_no_environment(tmp_path):
    assert ensure_env([], cache=tmp_path) is None
    refuse_in_process(None)


def test_an_environment_cannot_run_in_process(ok_env):
    with pytest.raises(RequirementError, match=r"declares requirements \(btb-fixture-ok==1\.0\)"
                       r".*drop --no-isolation"):
        refuse_in_process(ok_env[0])


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/einops/", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_real_wheel_from_pypi(tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI (https://pypi.org) cannot be reached from this machine")
    env = ensure_env(["einops==0.8.2"], cache=tmp_path / "cache")
    assert env.record() == [{"name": "einops", "version": "0.8.2"}]
    assert env.wheels[0][0] == "einops-0.8.2-py3-none-any.whl" and len(env.wheels[0][1]) == 64
    assert inside(env, tmp_path, "__import__('einops').__version__") == "0.8.2"


# ----------------------------------------------------------------------------------------------
# verify's advice


def _submission(tmp_path: Path, requirements: list[str] | None = None):
    d = tmp_path / "demo"
    d.mkdir()
    (d / "estimator.py").write_text("import kronfluence\n")
    meta = {"name": "demo", "authors": ["A"], "track": "open"}
    if requirements:
        meta["requirements"] = requirements
    (d / "submission.yaml").write_text(yaml.safe_dump(meta))
    (d / "results.json").write_text(json.dumps(MINIMAL_RESULTS))
    return load_submission(d)


#: the smallest results.json that load_submission accepts (benchmark.results_schema)
MINIMAL_RESULTS = {"schema_version": 3, "suite": {}, "verdict": "fail", "tasks": {},
                   "release": {"id": "tiny", "manifest_sha256": "a" * 64, "tasks": []},
                   "estimator": {"track": "open", "name": "demo", "class": "Demo",
                                 "sha256": "0" * 64, "tasks": ["rollouts"]}}


def test_verify_advice_for_a_missing_module_is_to_declare_it(tmp_path):
    sub = _submission(tmp_path)
    msg = ("demo/estimator.py: importing the file raised ModuleNotFoundError: No module named "
           "'kronfluence.analyzer'; an estimator file may import only installed packages")
    fix = _failure_fix(sub, msg)
    assert "declare it in" in fix and "requirements:" in fix and "'kronfluence'" in fix
    assert "--force" not in fix
    report = VerifyReport(sub.path, error=f"re-evaluation failed: {msg}", fix=fix)
    assert f"  fix: {fix}" in report.format()


def test_verify_advice_for_other_failures_is_to_fix_the_estimator(tmp_path):
    sub = _submission(tmp_path, ["einops==0.8.2"])
    fix = _failure_fix(sub, "KronfluenceEKFAC.score_rollouts raised RuntimeError: boom")
    assert fix.startswith("the estimator failed while being re-scored")


def test_verify_reports_an_uninstallable_requirement_with_its_fix(tmp_path, monkeypatch):
    from benchmark.sandbox import layers as sandbox
    from benchmark.submissions import verify_submission

    if not sandbox.probe().full:
        pytest.skip("verify needs the full sandbox (bubblewrap), which this machine lacks")
    monkeypatch.setenv("BT_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: the pin exists nowhere
    sub = _submission(tmp_path, ["btb-fixture-absent==1.0"])
    envs: dict = {}
    report = verify_submission(sub.path, progress=False, envs=envs)
    assert not report.ok
    assert report.error.startswith("requirements could not be installed: ")
    assert "'btb-fixture-absent==1.0' cannot be installed" in report.error
    assert report.fix.startswith(f"correct requirements: in {sub.path / 'submission.yaml'}")
    assert list(envs) == [(("btb-fixture-absent==1.0",), ())]  # tried once per (pins, sdists)


def test_cli_parses_requirements_and_time_limits():
    from benchmark.cli import build_parser

    a = build_parser().parse_args(["submit", "e.py", "--name", "n", "--authors", "A",
                                   "--requirements", "einops==0.8.2", "psutil==7.2.2",
                                   "--time-limit", "900"])
    assert a.requirements == ["einops==0.8.2", "psutil==7.2.2"] and a.time_limit == 900.0
    assert build_parser().parse_args(["submit", "e.py", "--name", "n"]).requirements is None
    assert build_parser().parse_args(["verify", "--time-limit", "700"]).time_limit == 700.0
