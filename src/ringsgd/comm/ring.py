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
    # reduce-scatter receives into scratch, two buffers so the next step's receives can be posted
    # while this step's are being added
    scratch = [_common.slices(_common.scratch(chunks[0].numel(), buf.dtype, buf.device, slot=i), k) for i in (0, 1)]
    steps = 2 * (n - 1)
    sends_reading: list[list[dist.Work]] = [[] for _ in range(n)]  # per chunk: isends not yet done
    recvs: dict[int, list] = {}

    def send_chunk(s: int) -> int:  # reduce-scatter: r-s; all-gather (t = s-n+1): r+1-t
        return (r - s) % n if s < n - 1 else (r + 1 - (s - n + 1)) % n

    def recv_chunk(s: int) -> int:
        return (r - s - 1) % n if s < n - 1 else (r - (s - n + 1)) % n

    def post_recvs(s: int) -> None:
        """Post step s's receives early: gloo sends only once the receiver has asked, so a receive
        posted late costs every hop an extra one-way trip."""
        c = recv_chunk(s)
        if s >= n - 1:  # all-gather lands in place: first let earlier sends of that chunk finish
            for w in sends_reading[c]:
                w.wait()
            sends_reading[c].clear()
        into = [scratch[s % 2][j][: parts[c][j].numel()] for j in range(k)] if s < n - 1 else parts[c]
        # a buffer smaller than N leaves some chunks empty: both ends know, so neither posts
        recvs[s] = [dist.irecv(t, left, group=g.group) if t.numel() else None for t in into]
        st.bytes_received += sum(t.numel() for t in into) * buf.element_size()

    def post_send(s: int, j: int) -> None:
        c = send_chunk(s)
        out = parts[c][j]
        if out.numel():
            sends_reading[c].append(dist.isend(out, right, group=g.group))
            st.bytes_sent += out.numel() * out.element_size()

    post_recvs(0)
    for j in range(k):
        post_send(0, j)
    if steps > 1:
        post_recvs(1)
    for s in range(steps):
        with timeline.span("ring_step", "ring", step=s, phase="reduce-scatter" if s < n - 1 else "all-gather"):
            c = recv_chunk(s)
            for j, work in enumerate(recvs.pop(s)):
                if work is not None:
                    work.wait()
                if s < n - 1:
                    part = parts[c][j]
                    part.add_(scratch[s % 2][j][: part.numel()])
                if s + 1 < steps:
                    post_send(s + 1, j)
            if s + 2 < steps:
                post_recvs(s + 2)
    for ws in sends_reading:
        for w in ws:
            w.wait()
