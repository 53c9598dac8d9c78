"""What a machine's floating-point results depend on: a fingerprint of CPU and libraries.

Bit-identical replay of a release's training run is a property of the machine that built it: the
same torch version can pick other kernels (and so other summation orders) on another CPU model or
instruction set. A release records :func:`fingerprint` of its build machine; :func:`kernel_match`
says whether this machine can be expected to reproduce it bit for bit. Everything else (causal
scores, verify) compares numbers within a measured tolerance instead (docs/causal.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

#: CPU flags that change which kernels torch/oneDNN/MKL pick (and so the rounding)
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw",
                "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile",
                "amx_bf16", "amx_int8")


def _cpuinfo() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                out.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return out


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def fingerprint() -> dict:
    """This machine: CPU model, vendor, kernel-relevant flags, torch's ISA level, versions.

    Returns a plain-JSON dict; ``key`` is a short hash of everything but ``cpu_count``.
    """
    import numpy as np
    import torch

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - old torch
        capability = None
    try:
        import transformers

        tf = transformers.__version__
    except ImportError:  # pragma: no cover
        tf = None
    fp = {
        "cpu": cpu_name(),
        "vendor": info.get("vendor_id"),
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "arch": platform.machine(),
        "flags": sorted(f for f in KERNEL_FLAGS if f in flags),
        "torch_cpu_capability": capability,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "transformers": tf,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    fp["key"] = fingerprint_key(fp)
    return fp


def fingerprint_key(fp: dict) -> str:
    """A 16-hex key of the fields that decide kernels and rounding (not the core count)."""
    keep = {k: fp.get(k) for k in ("cpu", "vendor", "family", "model", "arch", "flags",
                                   "torch_cpu_capability", "torch", "numpy", "transformers")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def kernel_match(build: dict | None, here: dict | None = None) -> tuple[bool, str]:
    """Whether this machine should reproduce ``build``'s floating point bit for bit.

    ``build`` is a release's recorded fingerprint (a release built before fingerprints were
    recorded may hold only ``cpu``; then the CPU name and torch version decide). Returns
    ``(match, reason)``; the reason names the first field that differs.
    """
    here = here or fingerprint()
    if not build:
        return False, "the release does not record its build machine"
    for field in ("cpu", "vendor", "family", "model", "flags", "torch_cpu_capability", "torch"):
        if field in build and build.get(field) != here.get(field):
            return False, (f"this machine's {field} is {here.get(field)!r}, the build machine's "
                           f"was {build.get(field)!r}")
    return True, "same CPU model, instruction set and torch as the build machine"
