"""Chunked ring all-reduce on torch.distributed point-to-point ops.

The buffer is cut into N chunks, one per rank. In N-1 reduce-scatter steps every rank sends one chunk
to its right neighbour and adds the chunk arriving from its left one, so after them rank r holds the
full sum of chunk r+1. In N-1 all-gather steps the finished chunks travel once more round the ring,
overwriting instead of adding. Every rank sends 2(N-1) chunks of S/N bytes, 2(N-1)/N * S in all,
whatever N is: no link carries more than any other, which is why the ring scales and a server does not.

Pipelining: each chunk is further cut into slices. As soon as slice j of step s has arrived and been
added, slice j of step s+1 is sent on, while later slices of step s are still in flight, so the link
and the adder work at the same time (NCCL does the same).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _common
from .. import timeline

# Slices of at most this many bytes; chunks smaller than this are sent whole.
SLICE_BYTES = 1 << 20


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Sum (or average) `tensor` in place over `group` with the chunked ring; returns `tensor`."""
    return _common.run_all_reduce(tensor, op, group, "ring", _ring)


def _ring(buf: torch.Tensor, g: _common.GroupView, st: _common.CommStats) -> None:
    n, r = g.size, g.rank
    right, left = g.peer(r + 1), g.peer(r - 1)
    chunks = _common.slices(buf, n)
    k = _common.pieces_for(chunks[0].numel(), buf.element_size(), SLICE_BYTES)
    parts = [_common.slices(c, k) for c in chunks]  # parts[chunk][slice]; same sizes on every rank
    scratch = _common.slices(_common.scratch(chunks[0].numel(), buf.dtype, buf.device), k)
    steps = 2 * (n - 1)
    sends: list[dist.Work] = []
    recvs: list[dist.Work | None] = [None] * k

    def send_chunk(s: int) -> int:  # reduce-scatter: r-s; all-gather (t = s-n+1): r+1-t
        return (r - s) % n if s < n - 1 else (r + 1 - (s - n + 1)) % n

    def recv_chunk(s: int) -> int:
        return (r - s - 1) % n if s < n - 1 else (r - (s - n + 1)) % n

    def post(s: int, j: int) -> None:
        out = parts[send_chunk(s)][j]
        # reduce-scatter receives into scratch (then adds); all-gather straight into place
        into = scratch[j][: parts[recv_chunk(s)][j].numel()] if s < n - 1 else parts[recv_chunk(s)][j]
        # a buffer smaller than N leaves some chunks empty: both ends know, so neither posts
        if out.numel():
            sends.append(dist.isend(out, right, group=g.group))
        recvs[j] = dist.irecv(into, left, group=g.group) if into.numel() else None
        st.bytes_sent += out.numel() * out.element_size()
        st.bytes_received += into.numel() * into.element_size()

    for j in range(k):
        post(0, j)
    for s in range(steps):
        with timeline.span("ring_step", "ring", step=s, phase="reduce-scatter" if s < n - 1 else "all-gather"):
            c = recv_chunk(s)
            for j in range(k):
                if recvs[j] is not None:
                    recvs[j].wait()
                if s < n - 1:
                    part = parts[c][j]
                    part.add_(scratch[j][: part.numel()])
                if s + 1 < steps:
                    post(s + 1, j)
    for w in sends:
        w.wait()
