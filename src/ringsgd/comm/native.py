"""torch.distributed.all_reduce (gloo / NCCL's own algorithms): the reference we measure against."""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _common


def native_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Sum (or average) `tensor` in place over `group` with torch.distributed; returns `tensor`."""
    return _common.run_all_reduce(tensor, op, group, "native", _native)


def _native(buf: torch.Tensor, g: _common.GroupView, st: _common.CommStats) -> None:
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=g.group)
