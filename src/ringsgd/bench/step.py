"""`ringsgd bench step`: one training step split into compute and communication, overlap on vs off.

Four things are timed in the same processes, interleaved iteration by iteration:
  compute   forward + backward + optimizer with no communication (inside no_sync)
  comm      the gradient buckets' all-reduces alone, back to back on the communication thread
  overlap   a real step, buckets reduced during backward
  serial    a real step, buckets reduced after backward (overlap=False)
Perfect overlap would make a step take max(compute, comm); no overlap takes compute + comm.
Inputs are random tensors of the data set's shape: the values do not change the time.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import comm, timeline
from ..launch import backend_for, launch, threads_per_worker
from ..models import build_model, default_model
from ..parallel import RingDataParallel
from .common import machine_info, median, print_table, slowest_rank, write_json

SHAPES = {"digits": (1, 28, 10), "mnist": (1, 28, 10), "cifar10": (3, 32, 10)}  # channels, size, classes


def _step_worker(model_name, dataset, batch, algo, iters, warmup, bucket_cap_mb, trace_path, device_type):
    rank = dist.get_rank()
    channels, size, classes = SHAPES[dataset]
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    net = RingDataParallel(build_model(model_name, channels, classes, size).to(device), algo=algo,
                           bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, channels, size, size, generator=g).to(device)
    y = torch.randint(0, classes, (batch,), generator=g).to(device)

    def sync():  # GPU work is asynchronous: time it to completion
        if device.type == "cuda":
            torch.cuda.synchronize()

    def compute():
        with net.no_sync():
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()

    def step(overlap):
        net.overlap = overlap
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    cases = {"compute": compute, "comm": net.all_reduce_buckets, "overlap": lambda: step(True), "serial": lambda: step(False)}
    times = {k: [] for k in cases}
    for it in range(warmup + iters):
        if trace_path and it == warmup:
            timeline.start(rank)
        for name, fn_ in cases.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn_()
            sync()
            t = slowest_rank(time.perf_counter() - t0)
            if it >= warmup:
                times[name].append(t)
    trace = timeline.stop().trace() if trace_path else None
    events = [None] * dist.get_world_size()
    if trace_path:
        dist.all_gather_object(events, trace)
        if rank == 0:
            timeline.write(trace_path, events)
    if rank:
        return None
    return {"times": times, "buckets": net.bucket_sizes(),
            "params": sum(p.numel() for p in net.parameters())}


def run(workers: int = 2, model: str | None = None, dataset: str = "digits", batch: int = 32,
        algos=("ring",), iters: int = 20, warmup: int = 3, bucket_cap_mb: float = 25.0,
        json_path: str | None = None, timeline_path: str | None = None, device: str = "cpu") -> dict:
    model = model or default_model(dataset)
    backend = backend_for(device)
    rows = []
    for algo in algos:
        res = launch(_step_worker, workers=workers, backend=backend, timeout=120,
                     args=(model, dataset, batch, algo, iters, warmup, bucket_cap_mb, timeline_path, device))[0]
        m = {k: median(v) for k, v in res["times"].items()}
        bound = max(m["compute"], m["comm"])
        rows.append({"algo": algo, "compute_ms": 1e3 * m["compute"], "comm_ms": 1e3 * m["comm"],
                     "overlap_ms": 1e3 * m["overlap"], "serial_ms": 1e3 * m["serial"],
                     "overlap_over_bound": m["overlap"] / bound,
                     "hidden_comm_fraction": max(0.0, min(1.0, (m["compute"] + m["comm"] - m["overlap"]) / m["comm"]))
                     if m["comm"] > 0 else 0.0,
                     "speedup_vs_serial": m["serial"] / m["overlap"], "buckets": len(res["buckets"]),
                     "params": res["params"], "raw_s": res["times"]})
    print(f"# one step: {model}, {workers} workers x batch {batch}, {threads_per_worker(workers)} thread(s)/worker, "
          f"median of {iters}")
    print_table(["algo", "buckets", "compute ms", "comm ms", "overlap ms", "serial ms", "overlap/max(c,m)",
                 "comm hidden", "serial/overlap"],
                [[r["algo"], r["buckets"], f"{r['compute_ms']:.1f}", f"{r['comm_ms']:.1f}", f"{r['overlap_ms']:.1f}",
                  f"{r['serial_ms']:.1f}", f"{r['overlap_over_bound']:.2f}", f"{100 * r['hidden_comm_fraction']:.0f}%",
                  f"{r['speedup_vs_serial']:.2f}x"] for r in rows])
    payload = {"benchmark": "step", "workers": workers, "model": model, "dataset": dataset, "batch": batch,
               "iters": iters, "bucket_cap_mb": bucket_cap_mb, "threads_per_worker": threads_per_worker(workers),
               "machine": machine_info(), "results": rows}
    write_json(json_path, payload)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default=None, help="lenet, cifar10_quick, resnet20 (default: the data set's net)")
    p.add_argument("--dataset", default="digits", choices=sorted(SHAPES), help="input shape to use")
    p.add_argument("--batch", type=int, default=32, help="samples per worker")
    p.add_argument("--algo", default="ring", help="comma list of ring, ps, native")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--json", default=None)
    p.add_argument("--timeline", default=None, help="also write a Chrome trace of the timed iterations")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per worker)")


def run_from_args(ns) -> int:
    algos = comm.parse_algorithms(ns.algo)
    run(ns.workers, ns.model, ns.dataset, ns.batch, algos, ns.iters, ns.warmup, ns.bucket_cap_mb, ns.json,
        ns.timeline, ns.device)
    return 0
