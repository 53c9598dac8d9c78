"""What every part of the estimator sandbox shares: its limits, its error and its constants.

Imports nothing from the sandbox package, so every module of it (and
:mod:`benchmark.sandbox.requirements`) may import this one without importing back.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmark.errors import BenchmarkError

#: where the view folder appears inside the sandbox
INSIDE_VIEW = "/bt-bench/view"
#: output of the estimator past which it is stopped; the last OUTPUT_TAIL characters are shown
OUTPUT_STOP, OUTPUT_TAIL = 64 << 20, 3000
#: largest estimator file accepted
MAX_ESTIMATOR_BYTES = 16 << 20
TEMP_PREFIX = "bt-bench-sandbox-"
#: the smoke test's steps before the requirements are imported (``smoke_inside``'s ``step``)
SMOKE_STEPS = ("import torch", "import transformers",
               "load a Qwen2 model with AutoModelForCausalLM")


class IsolationError(BenchmarkError):
    """The estimator's sandbox failed: crash, limit, refused access or a malformed result."""


@dataclass(frozen=True)
class Limits:
    """Limits of the estimator's sandbox (defaults fit the ``tiny`` release).

    Attributes:
        wall_seconds: one wall-clock deadline for starting, checking, scoring and reading back
            (both sandboxes of a ``score``: the full run and the determinism re-run).
        memory_bytes: memory of the whole process tree (cgroup) and address space of each
            process (``RLIMIT_AS``); Python + torch need about 1 GiB.
        max_processes: processes and threads of the whole tree.
        tmp_bytes: size of each private tmpfs (``/tmp``, ``/dev/shm``); counts as memory too.
    """

    wall_seconds: float = 600.0
    memory_bytes: int = 6 << 30
    max_processes: int = 512
    tmp_bytes: int = 1 << 30
