"""torch.distributed for the builder: one process per rank, gloo on CPU, NCCL on GPU.

A build started by ``torchrun`` (or ``bt-bench build --nproc N``, which runs torchrun) sees
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` in its environment; :func:`init` joins the
process group. Without them the build is a one-process group of its own (``world == 1``) and
every collective is a no-op, so the same code path serves both.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch

from benchmark.errors import BuildError


@dataclass(frozen=True)
class Dist:
    """This process's place in the build: ``rank`` of ``world`` processes."""

    rank: int = 0
    world: int = 1
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0 owns checkpoints, targets, draws, the curve and the manifest."""
        return self.rank == 0

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks in place and return it (identity in a one-process build)."""
        if self.world > 1:
            import torch.distributed as td

            td.all_reduce(t, op=td.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        """Wait for every rank (no-op in a one-process build)."""
        if self.world > 1:
            import torch.distributed as td

            td.barrier()

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as td

        box = [obj]
        td.broadcast_object_list(box, src=0)
        return box[0]


def init(timeout_s: float = 600.0) -> Dist:
    """Join the process group described by the environment, or return a one-process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as td

    rank = int(os.environ["RANK"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not td.is_initialized():
        try:
            td.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as exc:  # noqa: BLE001 - report the environment that failed
            raise BuildError(
                f"rank {rank} of {world} could not join the process group ({exc}); start "
                "distributed builds with `bt-bench build --nproc N` or torchrun"
            ) from exc
    return Dist(rank, world, backend)


def shutdown(d: Dist) -> None:
    """Leave the process group (no-op in a one-process build)."""
    if d.world > 1:
        import torch.distributed as td

        if td.is_initialized():
            td.destroy_process_group()
