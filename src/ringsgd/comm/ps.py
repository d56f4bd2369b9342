"""Parameter-server (client/server) all-reduce: the baseline the ring replaces.

Every worker sends its whole buffer to the server (group rank 0), which sums them and sends the
result back. The server receives and sends (N-1) * S bytes per all-reduce, so its link is the
bottleneck and the time grows linearly with N; a worker's own traffic is S each way. Slices are
pipelined exactly as in the ring, so the comparison is between topologies, not tunings.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _common
from .ring import SLICE_BYTES

SERVER = 0


def ps_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """Sum (or average) `tensor` in place over `group` through a server rank; returns `tensor`."""
    return _common.run_all_reduce(tensor, op, group, "ps", _ps)


def _ps(buf: torch.Tensor, g: _common.GroupView, st: _common.CommStats) -> None:
    k = _common.pieces_for(buf.numel(), buf.element_size(), SLICE_BYTES)
    mine = _common.slices(buf, k)
    nbytes = buf.numel() * buf.element_size()
    if g.rank != SERVER:
        server = g.peer(SERVER)
        sends = [dist.isend(p, server, group=g.group) for p in mine]
        recvs = [dist.irecv(p, server, group=g.group) for p in mine]
        for w in sends + recvs:
            w.wait()
        st.bytes_sent += nbytes
        st.bytes_received += nbytes
        return
    workers = [g.peer(w) for w in range(1, g.size)]
    inbox = [_common.slices(_common.scratch(buf.numel(), buf.dtype, buf.device, slot=i), k)
             for i in range(len(workers))]
    recvs = [[dist.irecv(inbox[i][j], w, group=g.group) for i, w in enumerate(workers)] for j in range(k)]
    sends: list[dist.Work] = []
    for j in range(k):
        for i, work in enumerate(recvs[j]):
            work.wait()
            mine[j].add_(inbox[i][j])
        sends += [dist.isend(mine[j], w, group=g.group) for w in workers]
    for w in sends:
        w.wait()
    st.bytes_sent += nbytes * len(workers)
    st.bytes_received += nbytes * len(workers)
