"""Checkpoints of a build: where they go, how they are written and read back.

``save_checkpoint`` writes ``save_pretrained``'s safetensors atomically and world-readable (the
sandbox's unprivileged user reads them); ``load_checkpoint`` reads one in fp32 or, for a float64
build, widened with every bit of the file; ``copy_checkpoint`` copies one folder's files (a
season panel's pinned post-SFT checkpoint, into a build or out of it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch

from benchmark.io import atomic_write_bytes

#: the files ``save_pretrained`` writes for one checkpoint
CHECKPOINT_FILES = ("model.safetensors", "config.json", "generation_config.json")


def _ckpt_dir(seed_dir: Path, step: int) -> Path:
    return seed_dir / "checkpoints" / f"step{step:04d}"


def save_checkpoint(model, path: Path) -> None:
    """``save_pretrained`` (safetensors, in the model's dtype) into a temp folder, then rename."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with quiet_transformers():
        model.save_pretrained(tmp, safe_serialization=True)
    _world_readable(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def _world_readable(folder: Path) -> None:
    """Give every file in ``folder`` mode 0644 and the folder 0755.

    transformers writes safetensors through a 0600 temp file; a release's checkpoints must be
    readable by the sandbox's unprivileged user, so they get the mode any user-created file has.
    """
    os.chmod(folder, 0o755)
    for f in folder.iterdir():
        if f.is_file():
            os.chmod(f, 0o644)


@contextlib.contextmanager
def quiet_transformers():
    """Turn transformers' per-file progress bars off for the duration of the block.

    "Loading weights" / "Writing model shards" bars mean nothing for a checkpoint that loads in
    milliseconds, and builds and replay workers load hundreds of them.
    """
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def load_checkpoint(path: Path, precision: str = "float32"):
    """Load a saved checkpoint with eager attention, in fp32 or (``"float64"``) widened.

    A float64 checkpoint (a float64 build's) must be loaded with ``precision="float64"``:
    loading it in fp32 rounds its parameters.
    """
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager"
        )
    if precision == "float64":
        # widen the fp32 model (its buffers, e.g. the rotary frequencies, as every float64
        # replay has them), then put the file's parameters in exactly: a float64 file's bits
        # survive, an fp32 file's values are the fp32 model's
        from safetensors.torch import load_file

        from benchmark.build.precision import widen

        widen(model)
        saved = load_file(Path(path) / "model.safetensors")
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in saved:
                    p.copy_(saved[name])
    return model


def _atomic_torch_save(obj, path: Path) -> None:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Copy the checkpoint folder ``src`` (:data:`CHECKPOINT_FILES` present) to ``dst``.

    Written into a temp sibling and renamed into place; the files get mode 0644.
    """
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in CHECKPOINT_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, tmp / name)
    _world_readable(tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
