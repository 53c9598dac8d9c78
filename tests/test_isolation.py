"""Hostile estimators: each is stopped with a clear message and no result is written."""

from __future__ import annotations

import socket
import threading

import pytest

from benchmark import sandbox
from benchmark.cli import main
from benchmark.isolation import Limits

pytestmark = pytest.mark.skipif(
    sandbox.landlock_abi() < 1,
    reason="the kernel has no Landlock; file isolation cannot be tested on this machine",
)


def hostile(tmp_path, body: str, score: str = "np.zeros(view.n)"):
    lines = [
        "import numpy as np",
        "from estimators.base import BaseEstimator",
        "",
        "class Hostile(BaseEstimator):",
        '    name = "hostile"',
        "",
        "    def score_rollouts(self, view):",
        *("        " + line for line in body.splitlines()),
        f"        return {score}",
    ]
    p = tmp_path / "hostile.py"
    p.write_text("\n".join(lines) + "\n")
    return p


def run(tmp_path, release, est, *extra):
    out = tmp_path / "results.json"
    out.write_text("previous")
    rc = main(["evaluate", str(est), "--release", str(release), "--out", str(out),
               "--no-progress", "--seeds", "0", *extra])
    assert rc == 2
    assert out.read_text() == "previous"  # nothing written, nothing lost
    return rc


def test_reading_the_labels_file_is_denied(micro_release, tmp_path, capsys):
    labels = micro_release / "seed0" / "labels.parquet"
    est = hostile(tmp_path, f"open({str(labels)!r}, 'rb').read()")
    run(tmp_path, micro_release, est)
    err = capsys.readouterr().err
    assert "hostile.py" in err and "denied access" in err and "labels.parquet" in err


def test_writing_into_the_release_is_denied(micro_release, tmp_path, capsys):
    target = micro_release / "seed0" / "planted.txt"
    est = hostile(tmp_path, f"open({str(target)!r}, 'w').write('x')")
    run(tmp_path, micro_release, est)
    assert "denied access" in capsys.readouterr().err
    assert not target.exists()


def test_network_is_unreachable(micro_release, tmp_path, capsys):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    est = hostile(tmp_path, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)")
    run(tmp_path, micro_release, est)
    err = capsys.readouterr().err
    assert "hostile.py" in err and ("denied" in err or "unreachable" in err)
    assert not accepted
    server.close()


def test_sleeping_past_the_time_limit(micro_release, tmp_path, capsys):
    est = hostile(tmp_path, "import time\ntime.sleep(120)")
    run(tmp_path, micro_release, est, "--time-limit", "8")
    assert "exceeded the wall-time limit of 8 s" in capsys.readouterr().err


def test_allocating_past_the_memory_limit(micro_release, tmp_path, capsys):
    est = hostile(tmp_path, "x = np.ones((3 << 30) // 8)  # 3 GiB")
    run(tmp_path, micro_release, est, "--memory-limit", "2")
    assert "ran out of memory under the limit of 2.0 GiB" in capsys.readouterr().err


def test_nan_scores(micro_release, tmp_path, capsys):
    est = hostile(tmp_path, "pass", score="np.full(view.n, np.nan)")
    run(tmp_path, micro_release, est)
    assert "non-finite scores" in capsys.readouterr().err


def test_exiting_the_process(micro_release, tmp_path, capsys):
    est = hostile(tmp_path, "import os\nos._exit(0)")
    run(tmp_path, micro_release, est)
    err = capsys.readouterr().err
    assert "exited with code 0 before returning its scores" in err


def test_import_time_code_never_runs_in_the_evaluator(micro_release, tmp_path, capsys):
    flag = tmp_path / "ran_in_parent"
    p = tmp_path / "import_time.py"
    p.write_text(f"open({str(flag)!r}, 'w').write('x')\n")  # denied in the sandbox
    run(tmp_path, micro_release, p)
    assert not flag.exists()
    assert "denied" in capsys.readouterr().err


def test_protections_are_recorded(micro_release, tmp_path):
    import json

    out = tmp_path / "r.json"
    rc = main(["evaluate", str(hostile(tmp_path, "pass")), "--release", str(micro_release),
               "--out", str(out), "--no-progress", "--seeds", "0"])
    assert rc == 0
    iso = json.loads(out.read_text())["isolation"]
    assert iso["protections"]["files"].startswith("landlock abi")
    assert iso["limits"] == {"wall_seconds": Limits().wall_seconds,
                             "memory_bytes": Limits().memory_bytes}
