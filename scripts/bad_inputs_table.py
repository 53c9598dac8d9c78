"""Run every bad input we know of through the real CLI and write docs/bad_inputs.md.

Each case builds its input in a temporary folder, runs ``bt-bench ...`` in a subprocess and records
the exit code and the first line of what the user sees. Run from the repository root:
``python scripts/bad_inputs_table.py`` (about two minutes; it evaluates on the shipped tiny
release with ``--seeds 0``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT.parent / "shared" / "reference" / "paper-runs"
sys.path.insert(0, str(ROOT))

GOOD = '''import numpy as np
from estimators.base import BaseEstimator


class Good(BaseEstimator):
    name = "good"
    tasks = ("rollouts", "draws")

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def score_rollouts(self, view):
        return self.scale * np.asarray(view.advantages, float)

    def score_draw(self, view, draw):
        return np.asarray(draw.fluency, float)
'''
BODY = "return self.scale * np.asarray(view.advantages, float)"
# replaces the sandbox's own sender: its first score array claims 8 TiB
FORGE = """import io, os
import numpy as np
import benchmark.sandbox.channel as _ch


def _forge(fd, key, arr):
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {'descr': '<f8', 'fortran_order': False,
                                             'shape': (2**40,)})
    p = len(key).to_bytes(2, 'little') + key.encode() + b.getvalue()
    os.write(fd, b'A' + len(p).to_bytes(4, 'little') + p)
    os._exit(0)


_ch.send_array = _forge
"""


def est(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


def body(tmp: Path, name: str, code: str) -> str:
    return est(tmp, name, GOOD.replace(BODY, code))


def run(args: list[str], cwd: Path, env: dict | None = None, n_lines: int = 2) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "benchmark.cli", *args], cwd=cwd,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    lines = [ln for ln in text if ln.startswith("bt-bench: error") or "FAILED" in ln
             or ln.startswith("  ")] or text[-1:]
    return proc.returncode, " ".join(ln.strip() for ln in lines[:n_lines])


def submission(root: Path, meta: str, results: dict | None = None) -> str:
    """A submissions folder holding one submission ``mine``; its path."""
    (root / "mine").mkdir(parents=True)
    (root / "mine" / "estimator.py").write_text(GOOD)
    (root / "mine" / "submission.yaml").write_text(meta)
    (root / "mine" / "results.json").write_text(json.dumps(
        results or {"estimator": {"track": "gradient", "name": "good"}}))
    return str(root)


def cases(tmp: Path) -> list[tuple]:
    """(area, bad input, CLI arguments[, environment variables, lines of the message shown])."""
    from tests.test_isolation import evil_wheels
    from tests.wheels import build_wheel

    ev = ["evaluate", "--seeds", "0", "--no-progress", "--out", str(tmp / "results.json")]
    labels = ROOT / "releases" / "tiny" / "seed0" / "labels.parquet"
    ckpt = next((ROOT / "releases" / "tiny" / "seed0" / "checkpoints").rglob("model.safetensors"))
    release_copy = tmp / "release"
    shutil.copytree(ROOT / "releases" / "tiny", release_copy)
    manifest = json.loads((release_copy / "manifest.json").read_text())
    manifest["schema_version"] = 99
    bad_schema = tmp / "bad_schema"
    shutil.copytree(release_copy, bad_schema)
    (bad_schema / "manifest.json").write_text(json.dumps(manifest))
    tampered = tmp / "tampered"
    shutil.copytree(release_copy, tampered)
    with (tampered / "seed0" / "targets" / "qzxbt.npz").open("ab") as fh:
        fh.write(b"x")
    missing_file = tmp / "missing_file"
    shutil.copytree(release_copy, missing_file)
    (missing_file / "seed0" / "rollouts.parquet").unlink()
    sub_dir = tmp / "submissions"
    (sub_dir / "mine").mkdir(parents=True)
    (sub_dir / "mine" / "estimator.py").write_text(GOOD)
    (sub_dir / "mine" / "submission.yaml").write_text(
        "name: mine\nauthors: [me]\ntrack: gradient\ncolour: blue\n")
    (sub_dir / "mine" / "results.json").write_text("{}")
    sub2 = tmp / "submissions2"
    (sub2 / "mine").mkdir(parents=True)
    (sub2 / "mine" / "estimator.py").write_text(GOOD)
    (sub2 / "mine" / "submission.yaml").write_text("name: mine\ntrack: gradient\n")
    (sub2 / "mine" / "results.json").write_text("{}")
    runs = tmp / "runs" / "seed0"
    runs.mkdir(parents=True)
    (runs / "ground_truth.jsonl").write_text('{"rollout_id": "a", "step": 0}\n{"rollout_id": \n')
    (runs / "attribution_scores.json").write_text(json.dumps(
        {"methods": {"m": [["a", 1.0]]}, "rollout_steps": {"a": 0}, "nonzero_steps": [0]}))
    runs2 = tmp / "runs2" / "seed0"
    runs2.mkdir(parents=True)
    (runs2 / "ground_truth.jsonl").write_text('{"rollout_id": "zzz", "step": 0}\n')
    (runs2 / "attribution_scores.json").write_text((runs / "attribution_scores.json").read_text())
    runs3 = tmp / "runs3" / "seed0"
    runs3.mkdir(parents=True)
    (runs3 / "ground_truth.jsonl").write_text("\n")
    (runs3 / "attribution_scores.json").write_text((runs / "attribution_scores.json").read_text())
    wheels = tmp / "wheels"
    evil_wheels(wheels, ROOT / "releases" / "tiny", "table")
    build_wheel(wheels, "btb-own", "1.0", {"btb_own.py": "",
                                           "btb_own-1.0.data/data/pyvenv.cfg": "home = /root\n"})
    local = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
             "BT_BENCH_TEST_CI_SECRET": "ci-secret-table"}
    private = tmp / "private"  # mode 0700 (mkdtemp): other users cannot traverse it
    (private / "tmp").mkdir(parents=True, mode=0o777)
    os.chmod(private, 0o700)
    y = "authors: [me]\ntrack: gradient\n"
    out = [
        ("estimator", "file does not exist", ev + [str(tmp / "nope.py")]),
        ("estimator", "not a Python file", ev + [est(tmp, "est.txt", GOOD)]),
        ("estimator", "syntax error", ev + [est(tmp, "syntax.py", "def f(:\n")]),
        ("estimator", "import error", ev + [est(tmp, "imp.py", "import not_a_module_xyz\n")]),
        ("estimator", "no estimator class", ev + [est(tmp, "none.py", "x = 1\n")]),
        ("estimator", "two estimator classes",
         ev + [est(tmp, "two.py", GOOD + GOOD.replace("class Good", "class Other"))]),
        ("estimator", "wrong shape", ev + [body(tmp, "shape.py", "return np.zeros(3)")]),
        ("estimator", "NaN scores", ev + [body(tmp, "nan.py", "return np.full(view.n, np.nan)")]),
        ("estimator", "timedelta64 scores (numpy counts them as integers)", ev + [body(
            tmp, "td.py", "return np.arange(view.n).astype('m8[s]')")]),
        ("estimator", "a masked array (its mask would be dropped)", ev + [body(
            tmp, "masked.py", "return np.ma.masked_array(np.zeros(view.n), "
            "mask=np.arange(view.n) % 2)")]),
        ("estimator", "non-numeric scores", ev + [body(tmp, "str.py", "return ['a'] * view.n")]),
        ("estimator", "modifies its input",
         ev + [body(tmp, "mut.py", "view.sketches[0, 0] = 1\n        return np.zeros(view.n)")]),
        ("estimator", "not deterministic",
         ev + [body(tmp, "rand.py", "return np.random.default_rng().random(view.n)")]),
        ("estimator", "__init__ does not store its argument",
         ev + [est(tmp, "init.py", GOOD.replace("self.scale = scale", "self._s = scale"))]),
        ("estimator", "constructor argument without default",
         ev + [est(tmp, "nodef.py", GOOD.replace("scale: float = 1.0", "scale: float"))]),
        ("estimator", "bad track", ev + [est(tmp, "track.py", GOOD.replace(
            'name = "good"', 'name = "good"\n    track = "closed"'))]),
        ("estimator", "name of a built-in control", ev + [est(tmp, "ctl.py", GOOD.replace(
            'name = "good"', 'name = "norm-only"'))]),
        ("sandbox", "reads the labels file by path",
         ev + [body(tmp, "labels.py", f"open({str(labels)!r}, 'rb')\n        return 0")]),
        ("sandbox", "opens a network connection", ev + [body(tmp, "net.py",
         "import socket\n        socket.create_connection(('127.0.0.1', 80), 2)\n"
         "        return 0")]),
        ("sandbox", "writes into the release folder", ev + [body(tmp, "write.py",
         f"open({str(labels.parent / 'x.txt')!r}, 'w')\n        return 0")]),
        ("sandbox", "sleeps past the time limit", ev + ["--time-limit", "5", body(
            tmp, "sleep.py", "import time\n        time.sleep(60)\n        return 0")]),
        ("sandbox", "allocates past the memory limit", ev + ["--memory-limit", "2", body(
            tmp, "mem.py", "x = np.ones(3 << 27)\n        return 0")]),
        ("sandbox", "calls os._exit", ev + [body(tmp, "exit.py",
         "import os\n        os._exit(0)")]),
        ("sandbox", "reads the labels through a symlink", ev + [body(tmp, "symlink.py",
         f"import os\n        os.symlink({str(labels)!r}, '/tmp/l')\n"
         "        open('/tmp/l', 'rb')\n        return 0")]),
        ("sandbox", "reads the git object store", ev + [body(tmp, "git.py",
         f"import os\n        os.listdir({str(ROOT / '.git' / 'objects')!r})\n        return 0")]),
        ("sandbox", "reads the evaluator's memory (/proc/<ppid>/mem)", ev + [body(tmp, "mem2.py",
         "import os\n        open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\n        return 0")]),
        ("sandbox", "opens a kernel tracing event (perf_event_open)", ev + [body(
         tmp, "perf.py", "import ctypes, os\n        libc = ctypes.CDLL(None, use_errno=True)\n"
         "        if libc.syscall(298, ctypes.create_string_buffer(128), -1, 0, -1, 0) < 0:\n"
         "            raise OSError(ctypes.get_errno(), 'perf_event_open')\n        return 0")]),
        ("sandbox", "publishes the evaluator's environment", ev + [body(tmp, "env.py",
         "import os\n        raise RuntimeError(open('/proc/1/environ').read()[:60])")]),
        ("sandbox", "forges a 'done' message on the result channel", ev + [body(tmp, "forge.py",
         "import json, os\n        cfg = json.loads(open('/proc/self/cmdline', 'rb').read()"
         ".split(b'\\0')[-2])\n        d = json.dumps({'type': 'done'}).encode()\n"
         "        os.write(cfg['channel'], b'J' + len(d).to_bytes(4, 'little') + d)\n"
         "        os._exit(0)")]),
        ("sandbox", "sends an .npy header claiming 8 TiB", ev + [est(tmp, "npy.py", FORGE + GOOD)]),
        ("sandbox", "a name with terminal escape codes", ev + [est(tmp, "esc.py", GOOD.replace(
            'name = "good"', 'name = "good\\x1b[2K\\rPASS"'))]),
        ("sandbox", "injects into the terminal (TIOCSTI)", ev + [body(tmp, "tty.py",
         "import fcntl, os, termios\n        fd = os.open('/dev/tty', os.O_RDWR)\n"
         "        fcntl.ioctl(fd, termios.TIOCSTI, b'x')\n        return 0")]),
        ("sandbox", "changes a checkpoint's mode", ev + [body(tmp, "chmod.py",
         f"import os\n        os.chmod({str(ckpt)!r}, 0o777)\n        return 0")]),
        ("sandbox", "makes a setuid binary in /dev/shm", ev + [body(tmp, "suid.py",
         "import os, shutil\n        shutil.copy('/bin/sh', '/dev/shm/sh')\n"
         "        os.chmod('/dev/shm/sh', 0o4755)\n        return 0")]),
        ("sandbox", "a fork bomb", ev + [body(tmp, "forks.py",
         "import os, time\n        while True:\n            if os.fork() == 0:\n"
         "                time.sleep(60)\n                os._exit(0)")]),
        ("sandbox", "forks past the memory limit", ev + ["--memory-limit", "2", body(
            tmp, "forkmem.py", "import os, time\n        for _ in range(4):\n"
            "            if os.fork() == 0:\n                a = np.ones((700 << 20) // 8)\n"
            "                time.sleep(60)\n        time.sleep(60)\n        return 0")]),
        ("sandbox", "prints 1 GiB", ev + [body(tmp, "print.py",
         "for _ in range(1024):\n            print('x' * (1 << 20))\n        return 0")]),
        ("sandbox", "fills /tmp", ev + [body(tmp, "fill.py",
         "with open('/tmp/f', 'wb') as fh:\n            for _ in range(2048):\n"
         "                fh.write(b'x' * (1 << 20))\n        return 0")]),
        ("sandbox", "a grandchild keeps the output pipes open", ev + ["--time-limit", "5", body(
            tmp, "grandchild.py", "import os, time\n        if os.fork() == 0:\n"
            "            os.setsid()\n            time.sleep(600)\n        time.sleep(600)")]),
        ("sandbox", "scores differ between processes", ev + [body(tmp, "urandom.py",
         "import os\n        return np.frombuffer(os.urandom(8 * view.n), np.uint64) % 7 * 1.0")]),
        ("estimator", "raises an exception (its traceback is shown)", ev + [body(
            tmp, "raises.py", "table = None\n        return table[0]")]),
        ("estimator", "raises deep inside a library (its frames and the library's are shown)",
         ev + [body(tmp, "deep.py", "return np.linalg.inv(np.zeros((2, 2)))")]),
        ("requirements", "a requirement that cannot be installed",
         ev + [str(tmp / "g.py"), "--requirements", "bt-bench-no-such-package==1.0"]),
        ("requirements", "breaks torch's stack (torchvision 0.28.0 on a CPU torch)",
         ev + [str(tmp / "g.py"), "--requirements", "torchvision==0.28.0"]),
        ("requirements", "pins a core package",
         ev + [str(tmp / "g.py"), "--requirements", "torch==2.5.0"]),
        ("requirements", "a range instead of an exact pin",
         ev + [str(tmp / "g.py"), "--requirements", "einops>=0.8"]),
        ("requirements", "a wheel whose .pth file and import-time code read the labels and a CI "
         "secret and write outside (the smoke test runs it in the sandbox; its report, shown as "
         "its error: uid 65534, nothing read or written outside its /tmp, pid 1 unreachable)",
         ev + [str(tmp / "g.py"), "--requirements", "btb-evil==2.0"], local, 3),
        ("requirements", "a wheel that replaces the environment's pyvenv.cfg (to bind /root)",
         ev + [str(tmp / "g.py"), "--requirements", "btb-own==1.0"], local),
        ("release", "unknown release id",
         ev + ["--release", "nonexistent", est(tmp, "g.py", GOOD)]),
        ("release", "wrong schema version",
         ev + ["--release", str(bad_schema), str(tmp / "g.py")]),
        ("release", "a file fails its checksum", ev + ["--release", str(tampered),
                                                      str(tmp / "g.py")]),
        ("release", "a file is missing", ev + ["--release", str(missing_file), str(tmp / "g.py")]),
        ("release", "seed not in the release", ["evaluate", "--seeds", "7", "--no-progress",
                                                str(tmp / "g.py")]),
        ("submission", "submission.yaml with an unknown key",
         ["verify", "--submissions-dir", str(sub_dir), "--no-progress"]),
        ("submission", "submission.yaml missing a key",
         ["verify", "--submissions-dir", str(sub2), "--no-progress"]),
        ("submission", "invalid submission name",
         ["submit", str(tmp / "g.py"), "--name", "Bad Name!", "--authors", "me"]),
        ("submission", "a name with a trailing newline", [
            "verify", "--no-progress", "--submissions-dir",
            submission(tmp / "subs-nl", 'name: "mine\\n"\n' + y)]),
        ("submission", "a description with a right-to-left override (U+202E)", [
            "verify", "--no-progress", "--submissions-dir",
            submission(tmp / "subs-bidi", 'name: mine\ndescription: "fine \\u202Eenil"\n' + y)]),
        ("submission", "a link with a trailing newline", [
            "verify", "--no-progress", "--submissions-dir",
            submission(tmp / "subs-link", 'name: mine\nlink: "https://example.org\\n"\n' + y)]),
        ("submission", "results.json edited to hold a control character (the leaderboard)", [
            "leaderboard", "--out", str(tmp / "lb"), "--submissions-dir",
            submission(tmp / "subs-res", "name: mine\n" + y, {
                "estimator": {"track": "gradient", "name": "good"},
                "verdict": "pass\n| 1 | fake | row |"})]),
        ("paper", "missing runs folder", ["paper", "reproduce", "--runs", str(tmp / "nope")]),
        ("paper", "malformed JSON line", ["paper", "reproduce", "--runs", str(runs.parent)]),
        ("paper", "ground truth ids not among the scored rollouts",
         ["paper", "reproduce", "--runs", str(runs2.parent)]),
        ("paper", "empty ground truth", ["paper", "reproduce", "--runs", str(runs3.parent)]),
    ]
    if os.geteuid() == 0:  # the sandbox changes uid only under root (as in CI)
        out.insert(next(i for i, c in enumerate(out) if c[0] == "estimator" and "raises" in c[1]),
                   ("sandbox", "TMPDIR inside a folder of mode 0700 (bt-bench as root)",
                    ev + [str(tmp / "g.py")], {"TMPDIR": str(private / "tmp")}))
    return out


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for area, what, args, *opts in cases(tmp):
            rc, msg = run(args, ROOT, *opts)
            msg = msg.replace(str(tmp), "<tmp>").replace(str(ROOT), "<repo>")
            rows.append((area, what, rc, msg))
            print(f"{rc}  {area:10s} {what}: {msg[:110]}", flush=True)
            if (tmp / "results.json").exists():
                raise SystemExit(f"{what}: a results file was written")
    lines = [
        "# Bad input: what the user sees",
        "",
        "Generated by `python scripts/bad_inputs_table.py`: each input is built in a temporary "
        "folder and run through the real `bt-bench` command; the message is the first error "
        "line (paths shortened). In every case nothing is written (the script checks that no "
        "results file appears). Exit code 2 = a clear error; 1 = verification found drift.",
        "",
        f"{len(rows)} cases.",
        "",
        "| area | bad input | exit | what the user sees |",
        "|---|---|---|---|",
    ]
    for area, what, rc, msg in rows:
        lines.append(f"| {area} | {what} | {rc} | {msg.replace('|', '/')} |")
    (ROOT / "docs" / "bad_inputs.md").write_text("\n".join(lines) + "\n")
    print(f"wrote docs/bad_inputs.md ({len(rows)} cases)")


if __name__ == "__main__":
    main()
