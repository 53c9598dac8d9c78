"""What one sandboxed run left behind (:class:`_Outcome`), before anything judges it.

Filled in by :mod:`benchmark.sandbox.watch` while the child runs; turned into scores or an error
by :mod:`benchmark.sandbox.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from benchmark.errors import BenchmarkError


@dataclass
class _Outcome:
    """One sandboxed run as it ended: what came back, and how (or why) it stopped."""

    meta: dict | None = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict | None = None
    done: bool = False
    timed_out: bool = False
    stopped: str = ""  # why the evaluator stopped it early ("" = it ended by itself)
    refused_sandbox: str = ""
    channel_error: str = ""
    exception: BenchmarkError | None = None  # a refused metadata or score array
    returncode: int | None = None
    oom: bool = False
    pids_refused: bool = False
    output: bytes = b""
    output_bytes: int = 0
    protections: dict = field(default_factory=dict)
    started: bool = False  # the sandboxed process said it was ready
    smoke: object = None  # the smoke test's report (mode "smoke"), unchecked
