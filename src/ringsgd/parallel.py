"""RingDataParallel: DistributedDataParallel's contract, our ring, gradients reduced during backward.

The data path, in order:
  hook (a parameter's gradient is ready) -> copy it into its bucket -> bucket full -> async all-reduce
  on the communication thread -> end of backward: wait every handle -> averaged gradients in p.grad.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from . import comm, timeline
from .buckets import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB, assign_buckets
from .errors import UsageError


class _Bucket:
    """A flat buffer holding several parameters' gradients, reduced with one all-reduce."""

    def __init__(self, index: int, params: list[nn.Parameter]):
        self.index = index
        self.params = params
        self.offsets = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        self.nbytes = total * self.buffer.element_size()
        self.reset()

    def reset(self) -> None:
        self.missing = set(range(len(self.params)))
        self.handle: comm.Handle | None = None

    def slot(self, i: int) -> torch.Tensor:
        return self.buffer[self.offsets[i]:self.offsets[i] + self.params[i].numel()]

    def put(self, i: int, grad: torch.Tensor | None) -> None:
        """Gradient of param i into the buffer (zeros if the param got none this pass)."""
        if grad is None:
            self.slot(i).zero_()
        else:
            self.slot(i).copy_(grad.reshape(-1))
        self.missing.discard(i)


class RingDataParallel(nn.Module):
    """Data-parallel wrapper: every rank holds a full replica; gradients are averaged in backward.

    Contract (that of torch.nn.parallel.DistributedDataParallel, so one can replace the other):
      * Construct it on every rank of the group, with the same model. At construction rank 0's
        parameters and buffers are broadcast, so all replicas start identical; a model that differs
        between ranks (names, shapes, dtypes) is one clear error on every rank.
      * Then the ordinary loop: `opt.zero_grad(); loss = f(model(x)); loss.backward(); opt.step()`.
        When `backward()` returns, every parameter's `.grad` holds the mean over all ranks; no extra
        call is needed.
      * Gradients are grouped in buckets in reverse registration order (the order backward makes
        them). With `overlap=True` a bucket's all-reduce starts on the communication thread as soon
        as its last gradient is ready, while backward computes the earlier layers; buckets start in
        the same order on every rank. `overlap=False` reduces the same buckets after backward.
      * Inside `with model.no_sync():` gradients only accumulate locally (gradient accumulation);
        the first backward outside reduces the accumulated gradients.
      * A parameter that gets no gradient in a pass (unused) contributes its current `.grad`, or
        zeros; afterwards its `.grad` holds the average like every other parameter. An unused
        parameter delays its bucket (and those after it) to the end of backward.
      * Buffers (e.g. BatchNorm statistics) are broadcast once, at construction, not every step.
      * Do not run other collectives on the same group from another thread while backward runs.
    """

    def __init__(self, module: nn.Module, algo: str = "ring", bucket_cap_mb: float = DEFAULT_CAP_MB,
                 overlap: bool = True, group=None, first_bucket_cap_mb: float = DEFAULT_FIRST_CAP_MB,
                 timeout: float = 60.0):
        super().__init__()
        self._all_reduce = comm.get_algorithm(algo)
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise UsageError("bucket_cap_mb and first_bucket_cap_mb must be positive")
        self.module = module
        self.algo = algo
        self.overlap = overlap
        self.timeout = timeout
        view = comm.group_view(group)
        self.world_size = view.size
        self._group = group
        # Gradient traffic gets a group of its own: its collectives run on the communication thread
        # and must not interleave with the user's on `group` (gloo orders them per group).
        self._comm_group = dist.new_group(ranks=view.global_ranks) if view.size > 1 else group
        _check_same_model(module, group, view)
        _broadcast_state(module, group, view)

        params, seen = [], set()
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        plan = assign_buckets([p.numel() * p.element_size() for p in params], int(bucket_cap_mb * 2**20),
                              int(first_bucket_cap_mb * 2**20), keys=[(p.dtype, p.device) for p in params])
        self.buckets = [_Bucket(b, [params[i] for i in idx]) for b, idx in enumerate(plan)]
        self._where = {}
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self._where[id(p)] = (b, i)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]
        self._sync = True
        self._in_pass = False
        self._next = 0
        # What happened in the last backward, in order: ("ready", param name), ("launch", bucket),
        # ("done", bucket), ("backward_end", None). Lets tests check overlap without timing.
        self.last_pass_events: list[tuple[str, object]] = []
        self._names = {id(p): n for n, p in module.named_parameters()}
        # Cumulative seconds: all-reduce running on the communication thread, and the main thread
        # blocked waiting for it at the end of backward (the communication backward did not hide).
        self.comm_seconds = 0.0
        self.wait_seconds = 0.0

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the next backward outside the block reduces them."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def bucket_sizes(self) -> list[int]:
        """Bytes per bucket, in the order they are reduced."""
        return [b.nbytes for b in self.buckets]

    def all_reduce_buckets(self) -> None:
        """Average every bucket's buffer as it is, now, and wait: a step's communication alone."""
        for b in self.buckets:
            self._launch(b)
        for b in self.buckets:
            b.handle.wait(self.timeout)

    # --- the reducer ------------------------------------------------------------------------------

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync or self.world_size == 1:
            return
        if not self._in_pass:
            self._in_pass = True
            self._next = 0
            self.last_pass_events = []
            for b in self.buckets:
                b.reset()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_pass)
        bucket, i = self._where[id(p)]
        bucket.put(i, p.grad)
        self.last_pass_events.append(("ready", self._names.get(id(p), "?")))
        if self.overlap:
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Start every bucket that is complete, strictly in bucket order (the same on all ranks)."""
        while self._next < len(self.buckets) and not self.buckets[self._next].missing:
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, b: _Bucket) -> None:
        self.last_pass_events.append(("launch", b.index))
        rec = timeline.active()
        queued = rec.now_us() if rec else 0.0

        def reduce() -> torch.Tensor:
            t0 = time.perf_counter()
            with timeline.span("allreduce", "comm", bucket=b.index, bytes=b.nbytes, algo=self.algo,
                               queued_us=queued):
                out = self._all_reduce(b.buffer, "mean", self._comm_group)
            self.comm_seconds += time.perf_counter() - t0
            return out

        b.handle = comm.run_async(reduce, what=f"{self.algo} all-reduce of bucket {b.index} ({b.nbytes} bytes)")

    def _finish_pass(self) -> None:
        """Runs when autograd finishes backward: reduce what is left, wait, write the averages."""
        self.last_pass_events.append(("backward_end", None))
        for b in self.buckets:
            for i in sorted(b.missing):  # unused this pass: its current .grad, or zeros
                b.put(i, b.params[i].grad)
        self._launch_ready()
        t0 = time.perf_counter()
        with timeline.span("wait", "wait"):
            for b in self.buckets:
                b.handle.wait(self.timeout)
                self.last_pass_events.append(("done", b.index))
        self.wait_seconds += time.perf_counter() - t0
        for b in self.buckets:
            for i, p in enumerate(b.params):
                if p.grad is None:
                    p.grad = b.slot(i).view_as(p).clone()
                else:
                    p.grad.copy_(b.slot(i).view_as(p))
        self._in_pass = False


def _signature(module: nn.Module) -> list[tuple[str, tuple, str]]:
    return [(n, tuple(t.shape), str(t.dtype)) for n, t in
            list(module.named_parameters()) + list(module.named_buffers())]


def _check_same_model(module: nn.Module, group, view) -> None:
    if view.size == 1:
        return
    mine = _signature(module)
    everyone: list = [None] * view.size
    dist.all_gather_object(everyone, mine, group=group)
    ref = everyone[0]
    for rank, sig in enumerate(everyone):
        if sig == ref:
            continue
        if len(sig) != len(ref):
            raise UsageError(f"the model on rank {rank} has {len(sig)} parameters and buffers, rank 0's has "
                             f"{len(ref)}: every rank must build the same model")
        for a, b in zip(ref, sig):
            if a != b:
                raise UsageError(f"the model on rank {rank} differs from rank 0's: {b[0]} is {b[1]} {b[2]} there "
                                 f"but {a[0]} is {a[1]} {a[2]} on rank 0; every rank must build the same model")


def _broadcast_state(module: nn.Module, group, view) -> None:
    """Rank 0's parameters and buffers to everyone, one flat tensor per dtype."""
    if view.size == 1:
        return
    tensors = [t for t in list(module.parameters()) + list(module.buffers())]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for ts in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            dist.broadcast(flat, src=view.global_ranks[0], group=group)
            offset = 0
            for t in ts:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
