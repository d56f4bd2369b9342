"""All-reduce algorithms, one entry each, all with the signature (tensor, op="sum", group=None).

- `ring_all_reduce`: ours, chunked and pipelined ring (ring.py).
- `ps_all_reduce`: parameter-server baseline (ps.py).
- `native_all_reduce`: torch.distributed.all_reduce, the reference (native.py).
- `all_reduce_async(tensor, algo, op, group)`: any of them on the communication thread; `.wait()`.
"""
from __future__ import annotations

from ..errors import UsageError
from ._common import CommStats, check_input, group_view, reset_stats, stats
from .async_work import Handle, run_async
from .native import native_all_reduce
from .ps import ps_all_reduce
from .ring import ring_all_reduce

ALGORITHMS = {"ring": ring_all_reduce, "ps": ps_all_reduce, "native": native_all_reduce}


def get_algorithm(name: str):
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UsageError(f"unknown algorithm {name!r}: use one of {', '.join(ALGORITHMS)}") from None


def parse_algorithms(text: str) -> list[str]:
    """'ring,ps,native' -> ['ring', 'ps', 'native'], each checked; for the --algo options."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise UsageError(f"no algorithm given: use a comma list of {', '.join(ALGORITHMS)}")
    for name in names:
        get_algorithm(name)
    return names


def all_reduce(tensor, algo: str = "ring", op: str = "sum", group=None):
    """Synchronous all-reduce with the named algorithm."""
    return get_algorithm(algo)(tensor, op, group)


def all_reduce_async(tensor, algo: str = "ring", op: str = "sum", group=None) -> Handle:
    """Start an all-reduce on the communication thread; the returned handle's wait() gives the tensor."""
    fn = get_algorithm(algo)
    group_view(group)
    check_input(tensor, op, group)  # bad input fails here, in the caller, not later in wait()
    return run_async(lambda: fn(tensor, op, group), what=f"{algo} all-reduce of {tensor.numel()} elements")


__all__ = ["ALGORITHMS", "CommStats", "Handle", "all_reduce", "all_reduce_async", "get_algorithm",
           "native_all_reduce", "parse_algorithms", "ps_all_reduce", "reset_stats", "ring_all_reduce", "stats"]
