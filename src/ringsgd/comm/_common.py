"""What every all-reduce algorithm shares: input checks, the fp32 working buffer, byte counters.

Each algorithm only sees a flat, contiguous working buffer and sums it in place over the group;
`run_all_reduce` does everything around that, so the three algorithms cannot drift apart in how
they treat dtypes, shapes, `op` or errors.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import defaultdict
from typing import Callable

import torch
import torch.distributed as dist

from ..errors import UsageError

OPS = ("sum", "mean")
# Half types are summed in fp32: N-way sums in fp16 lose bits at every hop of the ring.
_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


@dataclasses.dataclass
class CommStats:
    """Bytes this process put on / took off the wire for one algorithm (working-buffer dtype)."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


_STATS: dict[str, CommStats] = defaultdict(CommStats)


def stats(algo: str) -> CommStats:
    """Counters of `algo` in this process since the last `reset_stats()`."""
    return _STATS[algo]


def reset_stats() -> None:
    _STATS.clear()


@dataclasses.dataclass
class GroupView:
    """The group as an algorithm needs it: my position, the size, and group rank -> global rank."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    global_ranks: list[int]

    def peer(self, group_rank: int) -> int:
        return self.global_ranks[group_rank % self.size]


def group_view(group) -> GroupView:
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError(
            "torch.distributed is not initialised: run inside ringsgd.launch(...) or torchrun, "
            "or call torch.distributed.init_process_group(...) first"
        )
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    return GroupView(group, dist.get_rank(group), dist.get_world_size(group), list(ranks))


def check_input(tensor, op: str, group) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise UsageError(f"all-reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if op not in OPS:
        raise UsageError(f"unknown op {op!r}: use one of {', '.join(OPS)}")
    if tensor.is_complex() or tensor.dtype == torch.bool:
        raise UsageError(f"all-reduce of {tensor.dtype} tensors is not supported")
    if op == "mean" and not tensor.is_floating_point():
        raise UsageError(f"op='mean' needs a floating-point tensor, got {tensor.dtype}; use op='sum'")
    backend = dist.get_backend(group)
    if backend == "gloo" and tensor.device.type != "cpu":
        raise UsageError(
            f"tensor is on {tensor.device} but the process group uses gloo (CPU only): "
            "move it to the CPU or launch with backend='nccl'"
        )
    if backend == "nccl" and tensor.device.type != "cuda":
        raise UsageError("the process group uses nccl (GPU only): move the tensor to CUDA or use gloo")


def run_all_reduce(
    tensor: torch.Tensor,
    op: str,
    group,
    algo_name: str,
    algo: Callable[[torch.Tensor, GroupView, CommStats], None],
) -> torch.Tensor:
    """Check, build the flat working buffer, let `algo` sum it in place, divide, write back."""
    view = group_view(group)
    check_input(tensor, op, group)
    st = _STATS[algo_name]
    st.calls += 1
    if view.size == 1 or tensor.numel() == 0:
        return tensor  # the sum (and the mean) over one worker is the tensor itself
    work_dtype = _UPCAST.get(tensor.dtype, tensor.dtype)
    direct = tensor.is_contiguous() and work_dtype == tensor.dtype
    if direct:
        buf = tensor.view(-1)
    else:
        buf = scratch(tensor.numel(), work_dtype, tensor.device, slot=-1)
        buf.copy_(tensor.reshape(-1))
    algo(buf, view, st)
    if op == "mean":
        buf.div_(view.size)
    if not direct:
        tensor.copy_(buf.view(tensor.shape))
    return tensor


_SCRATCH: dict[tuple, torch.Tensor] = {}


def scratch(numel: int, dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
    """A reusable buffer of `numel` elements, one per (thread, slot).

    Fresh large CPU buffers cost a page fault per 4 KiB on first touch, which measured as slow as
    the transfer itself (40 ms for 32 MiB here); keeping them makes the ring's receive buffer free.
    Per thread, because the trainer's communication thread and the main thread may both reduce.
    """
    key = (threading.get_ident(), dtype, device, slot)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        buf = _SCRATCH[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def slices(t: torch.Tensor, pieces: int) -> tuple[torch.Tensor, ...]:
    """`t` cut into `pieces` views whose sizes differ by at most one element."""
    return torch.tensor_split(t, pieces)


def pieces_for(numel: int, element_size: int, slice_bytes: int) -> int:
    """How many slices keep each one under `slice_bytes` (at least one)."""
    return max(1, -(-numel * element_size // slice_bytes))
