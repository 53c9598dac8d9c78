"""Requirements published as source only: the sdist is built in the sandbox, the wheel checked.

A hostile ``setup.py`` tries, while its wheel is built, to write outside the sandbox, to reach a
server of this test on the loopback interface and to change its own sdist; each must fail (the
test fails if the build ran outside the sandbox: the file would exist, the server would hear it).
The wheel that comes back is refused unless it is a sane pure-Python wheel of exactly the pin.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from benchmark.sandbox.isolation import build_isolated
from benchmark.sandbox.requirements import RequirementError, ensure_env, parse_sdists
from benchmark.sandbox.sdist import SdistError, check_wheel, fetch_sdist, sdist_names
from benchmark.submissions import SubmissionError, validate_metadata
from tests.wheels import build_wheel, offline

HOSTILE_SETUP = '''
import os, socket
from setuptools import setup

report = {{}}
try:
    with open({outside!r}, "w") as f:
        f.write("escaped")
    report["write outside"] = "done"
except OSError as exc:
    report["write outside"] = f"refused: {{type(exc).__name__}}"
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    s.sendall(b"built outside the sandbox")
    report["connect"] = "done"
except OSError as exc:
    report["connect"] = f"refused: {{type(exc).__name__}}"
try:
    with open({sdist!r}, "ab") as f:
        f.write(b"x")
    report["change own sdist"] = "done"
except OSError as exc:
    report["change own sdist"] = f"refused: {{type(exc).__name__}}"
os.makedirs("btb_sdist", exist_ok=True)
with open("btb_sdist/report.py", "w") as f:
    f.write(f"REPORT = {{report!r}}\\n")
setup(name="btb-sdist", version="1.0", packages=["btb_sdist"])
'''


def _sdist(folder: Path, setup_py: str, name: str = "btb_sdist", version: str = "1.0") -> Path:
    """Write ``NAME-VERSION.tar.gz`` holding ``setup.py`` and a package ``btb_sdist``."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    path = folder / f"{name}-{version}.tar.gz"
    files = {"setup.py": setup_py, "btb_sdist/__init__.py": "VALUE = 7\n",
             "PKG-INFO": f"Metadata-Version: 2.1\nName: btb-sdist\nVersion: {version}\n"}
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    path.chmod(0o644)
    return path


@pytest.fixture
def listener():
    """A TCP server on the loopback interface; what it hears is in ``heard``."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    heard: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    heard.append(conn.recv(100))
                except OSError:
                    heard.append(b"<connected>")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], heard
    stop.set()
    t.join(2)
    srv.close()


def test_a_hostile_setup_py_builds_inside_the_sandbox_only(tmp_path, listener):
    port, heard = listener
    outside = tmp_path / "escaped.txt"
    folder = tmp_path / "sdists"
    sdist = folder / "btb_sdist-1.0.tar.gz"
    _sdist(folder, HOSTILE_SETUP.format(outside=str(outside), port=port, sdist=str(sdist)))
    before = sdist.read_bytes()
    report, wheel = build_isolated(sdist)
    assert report["stage"] == "ok", report
    # nothing of the build reached the host: no file, no connection, the sdist unchanged
    assert not outside.exists()
    assert heard == []
    assert sdist.read_bytes() == before
    assert check_wheel(report["wheel"], wheel, "btb-sdist==1.0") == "btb_sdist-1.0-py3-none-any.whl"
    # the build's own account (read as text from the wheel, never imported here)
    text = zipfile.ZipFile(io.BytesIO(wheel)).read("btb_sdist/report.py").decode()
    said = eval(text.split("=", 1)[1])  # a dict literal written by the test's own setup.py
    # the write lands in the sandbox's private tmpfs or is refused; it never reaches the host
    assert said["connect"].startswith("refused")
    assert said["change own sdist"].startswith("refused")


def test_a_failing_build_is_reported_with_its_output(tmp_path):
    sdist = _sdist(tmp_path / "s", "raise SystemExit('no compiler for this: CUDA needed')\n")
    report, wheel = build_isolated(sdist)
    assert wheel is None and report["stage"] == "build"
    assert "CUDA needed" in report["error"]


def test_ensure_env_builds_installs_and_smoke_tests_an_sdist(tmp_path):
    folder = tmp_path / "index"
    _sdist(folder, "from setuptools import setup\n"
                   "setup(name='btb-sdist', version='1.0', packages=['btb_sdist'])\n")
    env = ensure_env(["btb-sdist==1.0"], cache=tmp_path / "cache", pip_args=offline(folder),
                     build_from_sdist=["btb_sdist"])
    assert env.record() == [{"name": "btb-sdist", "version": "1.0"}]
    marker = json.loads((env.prefix / "bt-bench-env.json").read_text())
    (rec,) = marker["sdists"]
    assert rec["pin"] == "btb-sdist==1.0" and rec["wheel"] == "btb_sdist-1.0-py3-none-any.whl"
    assert rec["source"] == str(folder) and len(rec["sdist_sha256"]) == 64
    # without build_from_sdist the same pin is looked for as a wheel only, and there is none
    with pytest.raises(RequirementError, match=r"requirement 'btb-sdist==1\.0' cannot be "
                                               r"installed"):
        ensure_env(["btb-sdist==1.0"], cache=tmp_path / "cache", pip_args=offline(folder))


def test_fetch_sdist_from_a_local_folder_and_its_errors(tmp_path):
    folder = tmp_path / "f"
    _sdist(folder, "")
    dest = tmp_path / "d"
    dest.mkdir()
    path, digest, source = fetch_sdist("btb-sdist==1.0", dest, offline(folder))
    assert path.name == "btb_sdist-1.0.tar.gz" and source == str(folder) and len(digest) == 64
    with pytest.raises(SdistError, match=r"no sdist btb-sdist-2\.0\.tar\.gz in .* \(--no-index "
                                         r"--find-links\)"):
        fetch_sdist("btb-sdist==2.0", dest, offline(folder))
    assert "btb_sdist-1.0.tar.gz" in sdist_names("btb-sdist", "1.0")


def _wheel_bytes(tmp_path: Path, name="btb-sdist", version="1.0", files=None) -> tuple[str, bytes]:
    whl = build_wheel(tmp_path / "w", name, version, files or {"btb_sdist/__init__.py": "X = 1\n"})
    return whl.name, whl.read_bytes()


def test_check_wheel_accepts_the_pinned_pure_python_wheel(tmp_path):
    name, data = _wheel_bytes(tmp_path)
    assert check_wheel(name, data, "btb-sdist==1.0") == name


@pytest.mark.parametrize(("edit", "message"), [
    (lambda n, d: ("btb_sdist-1.0-cp311-cp311-linux_x86_64.whl", d),
     r"is named 'btb_sdist-1\.0-cp311-cp311-linux_x86_64\.whl'; expected "
     r"btb_sdist-1\.0-py3-none-any\.whl \(a pure-Python wheel"),
    (lambda n, d: ("other-1.0-py3-none-any.whl", d), r"is named 'other-1\.0-py3-none-any\.whl'"),
    (lambda n, d: ("btb_sdist-2.0-py3-none-any.whl", d), r"is named 'btb_sdist-2\.0"),
    (lambda n, d: (n, b"not a zip"), r"is not a valid zip archive \(BadZipFile\)"),
    (lambda n, d: (n, b""), r"is 0 bytes; expected 1 to 67108864"),
])
def test_check_wheel_refuses_names_and_archives(tmp_path, edit, message):
    name, data = edit(*_wheel_bytes(tmp_path))
    with pytest.raises(SdistError, match=message):
        check_wheel(name, data, "btb-sdist==1.0")


def test_check_wheel_refuses_paths_outside_and_other_metadata(tmp_path):
    name, data = _wheel_bytes(tmp_path, files={"../evil.py": "x"})
    with pytest.raises(SdistError, match=r"holds the member '\.\./evil\.py'; every member must "
                                         r"be a relative path inside the archive"):
        check_wheel(name, data, "btb-sdist==1.0")
    other, data = _wheel_bytes(tmp_path / "o", name="btb-other")
    with pytest.raises(SdistError, match=r"declares 'btb-other' '1\.0' in its METADATA; "
                                         r"expected btb-sdist 1\.0"):
        check_wheel(name, data, "btb-sdist==1.0")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a/__init__.py", "")
    with pytest.raises(SdistError, match=r"has dist-info folders \[\]; expected exactly one"):
        check_wheel(name, buf.getvalue(), "btb-sdist==1.0")


@pytest.mark.parametrize(("names", "message"), [
    ("traker", r"build_from_sdist must be a list of package names"),
    (["other"], r"build_from_sdist names 'other', which is not the name of a pin in requirements "
                r"\(traker==0\.3\.2\); add its exact pin"),
    (["traker", "Traker"], r"build_from_sdist names 'Traker' twice"),
])
def test_build_from_sdist_names_pins(names, message):
    with pytest.raises(RequirementError, match=message):
        parse_sdists(names, ["traker==0.3.2"], "x.yaml")
    with pytest.raises(SubmissionError, match=message):
        validate_metadata({"name": "t", "authors": ["A"], "track": "open",
                           "requirements": ["traker==0.3.2"], "build_from_sdist": names})


def test_build_from_sdist_in_submission_yaml():
    meta = validate_metadata({"name": "t", "authors": ["A"], "track": "open",
                              "requirements": ["traker==0.3.2"], "build_from_sdist": ["Traker"]})
    assert meta["build_from_sdist"] == ["traker"]
    assert list(meta) == ["name", "authors", "track", "kind", "requirements", "build_from_sdist"]
