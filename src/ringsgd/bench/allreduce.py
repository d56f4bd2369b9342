"""`ringsgd bench allreduce`: time ring, ps and native all-reduce, nccl-tests style.

All algorithms run in the same processes, interleaved iteration by iteration, so load on a shared
machine hits them alike and the ratio ring/native means something. Each timed iteration starts after
a barrier and counts until the slowest rank is done; the table shows the median.
algbw = S / t; busbw = algbw * 2(N-1)/N, the bandwidth each link actually carried in a ring.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import comm
from ..launch import launch, threads_per_worker
from .common import human_bytes, machine_info, median, print_table, slowest_rank, write_json


def _bench_worker(algos, sizes, iters, warmup, dtype_name):
    dtype = getattr(torch, dtype_name)
    n, rank = dist.get_world_size(), dist.get_rank()
    elem = torch.empty((), dtype=dtype).element_size()
    rows = []
    for nbytes in sizes:
        numel = max(1, nbytes // elem)
        # small integers: every algorithm's sum is exact, so any error is a bug, not rounding
        pattern = (torch.arange(numel, dtype=torch.int64) % 13 + rank).to(dtype)
        exact = sum((torch.arange(numel, dtype=torch.int64) % 13 + r) for r in range(n)).to(torch.float64)
        times = {a: [] for a in algos}
        errors = {}
        x = torch.empty(numel, dtype=dtype)
        # latency-bound sizes are the noisiest on a shared machine: give them more samples
        count = iters * 5 if nbytes <= (256 << 10) else iters if nbytes < (16 << 20) else max(3, iters // 2)
        for it in range(warmup + count):
            for algo in algos:
                x.copy_(pattern)
                dist.barrier()
                t0 = time.perf_counter()
                comm.all_reduce(x, algo, "sum")
                t = slowest_rank(time.perf_counter() - t0)
                if it >= warmup:
                    times[algo].append(t)
                if it == 0:
                    errors[algo] = float((x.to(torch.float64) - exact).abs().max())
        for algo in algos:
            t = median(times[algo])
            algbw = numel * elem / t / 1e9
            rows.append({"bytes": numel * elem, "algo": algo, "time_us": t * 1e6, "algbw_GBps": algbw,
                         "busbw_GBps": algbw * 2 * (n - 1) / n, "max_error": errors[algo],
                         "times_us": [x * 1e6 for x in times[algo]]})
    return rows if rank == 0 else None


def run(workers: int, algos: list[str], sizes: list[int], iters: int = 20, warmup: int = 3,
        dtype: str = "float32", json_path: str | None = None, timeout: float = 120.0) -> dict:
    for a in algos:
        comm.get_algorithm(a)
    rows = launch(_bench_worker, workers=workers, args=(algos, sizes, iters, warmup, dtype),
                  timeout=timeout)[0]
    print(f"# all-reduce, {workers} workers, {dtype}, gloo, {threads_per_worker(workers)} thread(s)/worker, "
          f"median of {iters} iterations")
    headers = ["size"] + [f"{a} {k}" for a in algos for k in ("us", "busbw")]
    if "native" in algos:
        headers += [f"{a}/native busbw" for a in algos if a != "native"]
    headers += ["max err"]
    table = []
    by = {(r["bytes"], r["algo"]): r for r in rows}
    for nbytes in sorted({r["bytes"] for r in rows}):
        line = [human_bytes(nbytes)]
        for a in algos:
            r = by[(nbytes, a)]
            line += [f"{r['time_us']:.0f}", f"{r['busbw_GBps']:.2f}"]
        if "native" in algos:
            line += [f"{by[(nbytes, a)]['busbw_GBps'] / by[(nbytes, 'native')]['busbw_GBps']:.2f}x"
                     for a in algos if a != "native"]
        line.append(f"{max(by[(nbytes, a)]['max_error'] for a in algos):g}")
        table.append(line)
    print_table(headers, table)
    payload = {"benchmark": "allreduce", "workers": workers, "dtype": dtype, "iters": iters,
               "threads_per_worker": threads_per_worker(workers), "machine": machine_info(), "results": rows}
    write_json(json_path, payload)
    return payload
