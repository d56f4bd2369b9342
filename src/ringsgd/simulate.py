"""An alpha-beta cost model of one data-parallel SGD step: ring vs parameter server, overlap or not.

Why a model: the paper ran 4 GPUs; this machine has a few CPU cores, so a measured scaling curve
stops at a handful of workers and says more about core sharing than about the algorithm. The model
replays one step from a compute profile (when each gradient is ready in backward) and a link
(latency alpha, bandwidth beta), with the same buckets RingDataParallel uses, so it can ask what
happens at 1024 workers, on NVLink, or with the paper's parameter server.

A message of S bytes costs alpha + S / beta on one link. What the model leaves out: congestion
beyond the one shared server link, stragglers, the time to copy gradients into buckets, and the
reduction arithmetic (its bandwidth is far above any link's here).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

from .buckets import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB, assign_buckets
from .errors import UsageError

MIB = 1 << 20
DEFAULT_CAP_BYTES = int(DEFAULT_CAP_MB * MIB)
DEFAULT_FIRST_CAP_BYTES = int(DEFAULT_FIRST_CAP_MB * MIB)


# --- links and collective costs -------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """One point-to-point link: a message of S bytes takes alpha_s + S / beta_Bps seconds.

    Links are full duplex (a ring rank sends right while it receives from the left) and every
    worker has one of its own.
    """
    name: str
    alpha_s: float
    beta_Bps: float
    fitted_workers: int | None = None  # fitted to a bench allreduce run with this many workers

    def __post_init__(self):
        if not (self.alpha_s >= 0 and self.beta_Bps > 0 and math.isfinite(self.alpha_s)
                and math.isfinite(self.beta_Bps)):
            raise UsageError(f"link {self.name!r} needs alpha >= 0 and a positive, finite bandwidth")

    def describe(self) -> str:
        return f"{self.name}: alpha {self.alpha_s * 1e6:.1f} us, beta {self.beta_Bps / 1e9:.2f} GB/s"


# Round numbers for the effective (not signalling) rate and per-message latency of each link; they
# set the scale, the model's conclusions do not hinge on the exact digits.
LINKS = {
    # PCIe 3.0 x16: 15.75 GB/s raw, ~12 GB/s achieved by cudaMemcpy peer-to-peer; ~10 us per message
    # through the driver. The interconnect of the paper's era (4 GPUs in one host, ~2015).
    "pcie3": Link("pcie3", 10e-6, 12e9),
    # NVLink 2/3 between a GPU pair: ~150 GB/s per direction achieved; ~5 us NCCL launch+sync.
    "nvlink": Link("nvlink", 5e-6, 150e9),
    # 10 Gigabit Ethernet: 1.25 GB/s line rate; ~30 us through the kernel TCP stack.
    "10gbe": Link("10gbe", 30e-6, 1.25e9),
    # 100 Gigabit Ethernet / EDR InfiniBand: 12.5 GB/s line rate; ~10 us with RDMA-class stacks.
    "100gbe": Link("100gbe", 10e-6, 12.5e9),
}


def _check_n(n: int) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UsageError(f"the number of workers must be a positive integer, got {n!r}")
    return n


def ring_cost(nbytes: float, n: int, link: Link) -> float:
    """Seconds for a ring all-reduce: 2(n-1) steps, each one chunk of S/n bytes on every link at once."""
    if _check_n(n) == 1:
        return 0.0
    return 2 * (n - 1) * (link.alpha_s + nbytes / (n * link.beta_Bps))


def ps_cost(nbytes: float, n: int, link: Link) -> float:
    """Seconds for a parameter-server all-reduce: push S from n-1 workers, then send the sum back.

    All n-1 pushes arrive on the server's single link, so they take (n-1) S / beta one after the
    other, and the replies leave the same way; the time grows linearly with n while the ring's
    stays near 2 S / beta. Push and reply are counted in sequence (the server replies to a piece
    only once every worker's copy of it is in): an upper bound where a full-duplex link could
    overlap the replies of one slice with the pushes of the next.
    """
    if _check_n(n) == 1:
        return 0.0
    return 2 * link.alpha_s + 2 * (n - 1) * nbytes / link.beta_Bps


def ring_bytes_per_rank(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce: 2(n-1)/n * S, about 2S for any n."""
    return 2 * (_check_n(n) - 1) / n * nbytes


def ps_server_bytes(nbytes: float, n: int) -> float:
    """Bytes through the server's link per all-reduce: (n-1) S in plus (n-1) S out."""
    return 2 * (_check_n(n) - 1) * nbytes


COSTS = {"ring": ring_cost, "ps": ps_cost}


def _cost_fn(algo: str):
    if algo not in COSTS:
        raise UsageError(f"no cost model for algorithm {algo!r}: use one of {', '.join(COSTS)}")
    return COSTS[algo]


def fit_link(allreduce_json_rows: list[dict], n: int, name: str | None = None) -> Link:
    """Fit alpha and beta to `ringsgd bench allreduce` results for the ring at `n` workers.

    Model: t = 2(n-1) alpha + 2(n-1)/n * S / beta. Each row is weighted by 1/t (relative error):
    the sizes span several decades, and an unweighted fit would let the largest ones decide alone,
    leaving alpha, which only the small ones show, to noise.
    """
    import numpy as np

    if _check_n(n) < 2:
        raise UsageError("fitting a link needs all-reduce results from at least 2 workers")
    rows = [r for r in allreduce_json_rows if r.get("algo") == "ring"]
    sizes = {r["bytes"] for r in rows}
    if len(sizes) < 2:
        raise UsageError("fitting a link needs ring all-reduce times for at least two message sizes")
    t = np.array([r["time_us"] * 1e-6 for r in rows])
    a = np.array([[2 * (n - 1), 2 * (n - 1) / n * r["bytes"]] for r in rows], dtype=float)
    w = 1 / t
    (alpha, inv_beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if alpha < 0:  # latency lost in noise: fit bandwidth alone through the origin
        alpha = 0.0
        inv_beta = float(np.sum(a[:, 1] * t * w * w) / np.sum((a[:, 1] * w) ** 2))
    if inv_beta <= 0:
        raise UsageError("the all-reduce times do not grow with message size, so no bandwidth can be fitted")
    return Link(name or f"fit(n={n})", float(alpha), float(1 / inv_beta))


def link_from_json(path: str) -> Link:
    """A Link fitted to the JSON file `ringsgd bench allreduce --json` wrote."""
    payload = _read_json(path)
    if not isinstance(payload, dict) or "results" not in payload or "workers" not in payload:
        raise UsageError(f"{path} is not the JSON of `ringsgd bench allreduce` (no 'workers' and 'results')")
    link = fit_link(payload["results"], int(payload["workers"]), name=os.path.basename(path))
    return replace(link, fitted_workers=int(payload["workers"]))


def parse_links(text: str) -> list[Link]:
    """'pcie3,nvlink', 'all', a bench-allreduce JSON file, or 'NAME:ALPHA_US:GBPS'."""
    links = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item == "all":
            links += LINKS.values()
        elif item in LINKS:
            links.append(LINKS[item])
        elif item.endswith(".json"):
            links.append(link_from_json(item))
        elif item.count(":") == 2:
            name, alpha, gbps = item.split(":")
            try:
                links.append(Link(name, float(alpha) * 1e-6, float(gbps) * 1e9))
            except ValueError:
                raise UsageError(f"cannot read link {item!r}: write NAME:ALPHA_US:GBPS, e.g. ib:2:25") from None
        else:
            raise UsageError(f"unknown link {item!r}: use {', '.join(LINKS)}, a bench allreduce JSON file, "
                             f"or NAME:ALPHA_US:GBPS")
    if not links:
        raise UsageError("no links given")
    return links


# --- compute profiles -----------------------------------------------------------------------------

@dataclass
class GradReady:
    """A parameter's gradient: its size and when it is ready, in seconds after backward starts.

    `index` is the parameter's position in registration order (model.parameters()), which is what
    the bucket assignment takes; -1 means unknown, and then the profile's grads are taken to be in
    exact reverse registration order.
    """
    name: str
    nbytes: int
    ready_s: float
    index: int = -1


@dataclass
class Profile:
    """One worker's compute for one step, grads in the order backward produces them."""
    forward_s: float
    grads: list[GradReady]
    optimizer_s: float
    batch: int
    backward_s: float | None = None  # None: the last gradient's ready time
    meta: dict = field(default_factory=dict)  # how it was obtained: model, method, threads, ...

    def __post_init__(self):
        if self.backward_s is None:
            self.backward_s = max((g.ready_s for g in self.grads), default=0.0)
        if not self.grads:
            raise UsageError("a profile needs at least one parameter gradient")

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def grad_bytes(self) -> int:
        return sum(g.nbytes for g in self.grads)

    def in_registration_order(self) -> list[GradReady]:
        """The grads ordered as the model registered its parameters: the order assign_buckets takes."""
        if all(g.index >= 0 for g in self.grads):
            return sorted(self.grads, key=lambda g: g.index)
        return list(reversed(self.grads))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        try:
            grads = [GradReady(g["name"], int(g["nbytes"]), float(g["ready_s"]), int(g.get("index", -1)))
                     for g in d["grads"]]
            return cls(float(d["forward_s"]), grads, float(d["optimizer_s"]), int(d["batch"]),
                       None if d.get("backward_s") is None else float(d["backward_s"]), dict(d.get("meta", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"not a ringsgd profile: {type(e).__name__} {e}") from None


def save_profile(profile: Profile, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(profile.to_dict(), f, indent=2)


def load_profile(path: str) -> Profile:
    d = _read_json(path)
    if not isinstance(d, dict):
        raise UsageError(f"{path} is not a ringsgd profile (expected a JSON object)")
    return Profile.from_dict(d)


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read {path} as JSON: {e}") from None


def _params(model) -> list:
    """Parameters that get gradients, deduplicated, in registration order (as RingDataParallel takes them)."""
    out, seen = [], set()
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _names(model) -> dict:
    return {id(p): n for n, p in model.named_parameters()}


def _output_classes(model, input_shape) -> int:
    import torch

    with torch.no_grad():
        out = model(torch.zeros(1, *input_shape))
    return int(out.shape[-1])


def profile_model(model, input_shape, batch: int, steps: int = 5, warmup: int = 2, lr: float = 0.01) -> Profile:
    """Measure one training step of `model` on this machine, in this process: the median of `steps`.

    Gradient-ready times come from post-accumulate-grad hooks, the same event RingDataParallel
    launches buckets on. Uses whatever torch.get_num_threads() is now; the count is kept in meta.
    """
    import torch
    import torch.nn.functional as F

    if batch < 1 or steps < 1:
        raise UsageError("batch and steps must be positive")
    model.train()
    params = _params(model)
    names = _names(model)
    classes = _output_classes(model, input_shape)
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *input_shape, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    stamp: dict[int, float] = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p: stamp.__setitem__(id(p), time.perf_counter()))
             for p in params]
    fwd, bwd, optim, ready = [], [], [], {id(p): [] for p in params}
    try:
        for step in range(warmup + steps):
            opt.zero_grad(set_to_none=True)
            stamp.clear()
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if step < warmup:
                continue
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            optim.append(t3 - t2)
            for p in params:  # a parameter backward never reached is ready when backward ends
                ready[id(p)].append(stamp.get(id(p), t2) - t1)
    finally:
        for h in hooks:
            h.remove()
    med = statistics.median
    grads = [GradReady(names.get(id(p), f"param{i}"), p.numel() * p.element_size(), med(ready[id(p)]), i)
             for i, p in enumerate(params)]
    grads.sort(key=lambda gr: (gr.ready_s, -gr.index))
    return Profile(med(fwd), grads, med(optim), batch, med(bwd),
                   {"method": "measure", "threads": torch.get_num_threads(), "steps": steps,
                    "input_shape": list(input_shape)})


def count_flops(model, input_shape, batch: int) -> list[tuple[object, float]]:
    """(leaf module, forward FLOPs) in the order the forward pass first runs them.

    Counts 2 FLOPs per multiply-accumulate of Conv and Linear layers; every other layer (ReLU,
    pooling, BatchNorm, ...) counts zero, being memory-bound and small next to them.
    """
    import torch
    from torch import nn

    order: list = []
    flops: dict[int, float] = {}

    def hook(mod, inputs, out):
        if id(mod) not in flops:
            order.append(mod)
            flops[id(mod)] = 0.0
        if isinstance(mod, nn.modules.conv._ConvNd):
            macs = out.numel() * (mod.in_channels // mod.groups) * math.prod(mod.kernel_size)
        elif isinstance(mod, nn.Linear):
            macs = out.numel() * mod.in_features
        else:
            macs = 0
        flops[id(mod)] += 2.0 * macs

    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            model(torch.zeros(batch, *input_shape))
    finally:
        for h in hooks:
            h.remove()
    return [(m, flops[id(m)]) for m in order]


def flops_profile(model, input_shape, batch: int, flops_per_s: float, mem_Bps: float = 288e9) -> Profile:
    """A profile derived from FLOPs, for a GPU we do not have.

    Assumptions: every layer runs at `flops_per_s` (an *effective* rate: peak times an efficiency;
    small CNNs at batch 64 reach perhaps a third of a 2015 GPU's ~5 TFLOP/s fp32 peak); backward
    costs twice the forward per layer (gradients for the input and for the weights), runs the
    layers in reverse forward order, and a layer's parameter gradients are ready when its backward
    ends. The SGD momentum step is memory-bound: it reads weight, gradient and momentum and writes
    two of them, 5 x the gradient bytes at `mem_Bps` (288 GB/s: a Tesla K40 / GTX Titan).
    """
    if flops_per_s <= 0 or mem_Bps <= 0:
        raise UsageError("the FLOP rate and memory bandwidth must be positive")
    params = _params(model)
    names = _names(model)
    index = {id(p): i for i, p in enumerate(params)}
    layers = count_flops(model, input_shape, batch)
    forward = sum(f for _, f in layers) / flops_per_s
    grads, t, placed = [], 0.0, set()
    for mod, f in reversed(layers):
        t += 2 * f / flops_per_s
        for p in mod.parameters(recurse=False):
            if id(p) in index and id(p) not in placed:
                placed.add(id(p))
                grads.append(GradReady(names[id(p)], p.numel() * p.element_size(), t, index[id(p)]))
    backward = t
    for p in params:  # not in a leaf module forward ran: ready when backward ends
        if id(p) not in placed:
            grads.append(GradReady(names.get(id(p), "?"), p.numel() * p.element_size(), backward, index[id(p)]))
    # within a layer, backward order is reverse registration (bias before weight), as autograd does
    grads.sort(key=lambda g: (g.ready_s, -g.index))
    optimizer = 5 * sum(g.nbytes for g in grads) / mem_Bps
    return Profile(forward, grads, optimizer, batch, backward,
                   {"method": "flops", "flops_per_s": flops_per_s, "mem_Bps": mem_Bps,
                    "forward_flops": sum(f for _, f in layers), "input_shape": list(input_shape)})


# --- the step -------------------------------------------------------------------------------------

def scale_profile(profile: Profile, factor: float) -> Profile:
    """The same profile with every compute time multiplied by `factor` (a faster or slower machine)."""
    grads = [replace(g, ready_s=g.ready_s * factor) for g in profile.grads]
    return Profile(profile.forward_s * factor, grads, profile.optimizer_s * factor, profile.batch,
                   profile.backward_s * factor, {**profile.meta, "scaled": factor})


def cpu_slowdown(n: int, threads: int, cores: int) -> float:
    """How much slower each worker computes when n processes of `threads` threads share `cores` cores."""
    return max(1.0, n * threads / cores)


def simulate_step(profile: Profile, n: int, algo: str, link: Link, overlap: bool, bucket_cap_bytes: int,
                  first_cap_bytes: int | None = None, compute_slowdown: float = 1.0) -> dict:
    """Replay one step of RingDataParallel: the seconds it takes and where they go.

    Buckets are those assign_buckets makes (`first_cap_bytes=None`: the first bucket has the
    normal cap; pass DEFAULT_FIRST_CAP_BYTES to match RingDataParallel's default). A bucket is
    ready when its last gradient is. With overlap the all-reduces run one at a time in bucket order
    on the communication thread, each as soon as it is ready and the previous one is done; without,
    all of them after backward. The optimizer waits for the last all-reduce.
    """
    cost = _cost_fn(algo)
    _check_n(n)
    if compute_slowdown <= 0:
        raise UsageError("compute_slowdown must be positive")
    reg = profile.in_registration_order()
    plan = assign_buckets([g.nbytes for g in reg], bucket_cap_bytes, first_cap_bytes)
    k = compute_slowdown
    forward, backward, optimizer = profile.forward_s * k, profile.backward_s * k, profile.optimizer_s * k
    sizes = [sum(reg[i].nbytes for i in b) for b in plan]
    ready = [max(reg[i].ready_s for i in b) * k for b in plan]
    costs = [cost(s, n, link) for s in sizes]
    if overlap:
        end = 0.0
        for r, c in zip(ready, costs):
            end = max(r, end) + c
        step = forward + max(backward, end) + optimizer
    else:
        step = forward + backward + sum(costs) + optimizer
    compute = forward + backward + optimizer
    total = profile.grad_bytes
    traffic = ring_bytes_per_rank(total, n) if algo == "ring" else ps_server_bytes(total, n)
    return {"workers": n, "algo": algo, "link": link.name, "overlap": bool(overlap), "buckets": len(plan),
            "grad_bytes": total, "busiest_link_bytes": traffic, "compute_s": compute, "comm_s": sum(costs),
            "exposed_comm_s": step - compute, "step_s": step}


def speedup_table(profile: Profile, ns, algos, links, overlap_modes=(True, False),
                  bucket_cap_bytes: int = DEFAULT_CAP_BYTES,
                  first_cap_bytes: int | None = DEFAULT_FIRST_CAP_BYTES) -> list[dict]:
    """Weak scaling (the batch per worker fixed): speedup = n t(1) / t(n), efficiency = speedup / n.

    n workers process n batches in t(n), one worker one batch in t(1): the throughput ratio.
    Bucket caps default to RingDataParallel's.
    """
    rows = []
    for link in links:
        for algo in algos:
            for overlap in overlap_modes:
                base = simulate_step(profile, 1, algo, link, overlap, bucket_cap_bytes, first_cap_bytes)["step_s"]
                for n in ns:
                    r = simulate_step(profile, n, algo, link, overlap, bucket_cap_bytes, first_cap_bytes)
                    r["speedup"] = n * base / r["step_s"]
                    r["efficiency"] = r["speedup"] / n
                    rows.append(r)
    return rows


def validate(measured: list[dict], profile: Profile, link: "Link | list[Link]",
             bucket_cap_bytes: int = DEFAULT_CAP_BYTES, first_cap_bytes: int | None = DEFAULT_FIRST_CAP_BYTES,
             cores: int | None = None) -> list[dict]:
    """Predict each measured point (keys workers, algo, overlap, step_s) and report the relative error.

    On a CPU machine n workers share the cores: a point's compute is slowed by its own
    "compute_slowdown" if it has one, else, when `cores` is given, by cpu_slowdown(n, threads,
    cores) with the point's "threads" (or the profile's).
    """
    links = link if isinstance(link, list) else [link]
    out = []
    for m in measured:
        try:
            n, algo, overlap, step = int(m["workers"]), m["algo"], bool(m["overlap"]), float(m["step_s"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"a measured point needs workers, algo, overlap and step_s, got {m!r}") from None
        # the link measured with this many workers, if there is one (an oversubscribed CPU run has
        # its own latency), else the first
        here = next((l for l in links if l.fitted_workers == n), links[0])
        slow = m.get("compute_slowdown")
        threads = m.get("threads", profile.meta.get("threads", 1))
        if slow is None:
            slow = cpu_slowdown(n, threads, cores) if cores else 1.0
        # On a CPU whose every core computes, the transfer's copy work needs those same cores: it
        # cannot hide behind backward, so the step pays it in full.
        saturated = bool(cores) and n > 1 and n * threads >= cores
        p = simulate_step(profile, n, algo, here, overlap and not saturated, bucket_cap_bytes, first_cap_bytes,
                          float(slow))
        out.append({"workers": n, "algo": algo, "overlap": overlap, "compute_slowdown": float(slow),
                    "link": here.name, "cpu_saturated": saturated,
                    "measured_s": step, "predicted_s": p["step_s"],
                    "rel_error": (p["step_s"] - step) / step if step > 0 else float("nan")})
    return out


# --- plot -----------------------------------------------------------------------------------------

def plot_speedups(table: list[dict], path: str) -> None:
    """Speedup vs workers (log2 both ways), one panel per link: ring vs ps, overlap vs not, ideal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not table:
        raise UsageError("nothing to plot: the speedup table is empty")
    links = list(dict.fromkeys(r["link"] for r in table))
    cols = min(2, len(links))
    rows = math.ceil(len(links) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    ns = sorted({r["workers"] for r in table})
    colors = {"ring": "tab:blue", "ps": "tab:red"}
    for ax, link in zip(axes.flat, links):
        ax.plot(ns, ns, color="0.6", lw=1, ls=":", label="ideal")
        series = dict.fromkeys((r["algo"], r["overlap"]) for r in table if r["link"] == link)
        for algo, overlap in series:
            pts = sorted((r["workers"], r["speedup"]) for r in table
                         if r["link"] == link and r["algo"] == algo and r["overlap"] == overlap)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    color=colors.get(algo), ls="-" if overlap else "--",
                    label=f"{algo}, {'overlap' if overlap else 'after backward'}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlim(min(ns), max(ns))
        ax.set_title(link)
        ax.set_xlabel("workers")
        ax.set_ylabel("speedup (weak scaling)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(links):]:
        ax.set_visible(False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- CLI glue -------------------------------------------------------------------------------------

MODEL_INPUTS = {"lenet": (1, 28, 28), "cifar10_quick": (3, 32, 32), "resnet20": (3, 32, 32)}


def parse_workers(text: str) -> list[int]:
    """'1..1024' (powers of two from 1), '1,2,3,4' or a mix: '1..1024,3' -> sorted worker counts."""
    ns = set()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            if ".." in item:
                lo, hi = (int(t) for t in item.split("..", 1))
                if lo < 1 or hi < lo:
                    raise ValueError
                while lo <= hi:
                    ns.add(lo)
                    lo *= 2
            else:
                ns.add(int(item))
        except ValueError:
            raise UsageError(f"cannot read workers {item!r}: write e.g. 1..1024, 1,2,3,4 or 1..64,3") from None
    if not ns or min(ns) < 1:
        raise UsageError("worker counts must be positive integers")
    return sorted(ns)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(MODEL_INPUTS), default="lenet",
                        help="network to profile (ignored with --profile FILE.json)")
    parser.add_argument("--batch", type=int, default=64, help="batch per worker (weak scaling)")
    parser.add_argument("--profile", default="flops",
                        help="measure (time it here), flops (derive from FLOPs), or a saved FILE.json")
    parser.add_argument("--gpu-tflops", type=float, default=5.0,
                        help="peak fp32 TFLOP/s for --profile flops (5: a 2015 Tesla K40 / GTX Titan)")
    parser.add_argument("--efficiency", type=float, default=0.3,
                        help="fraction of peak the layers reach, for --profile flops")
    parser.add_argument("--steps", type=int, default=5, help="timed steps for --profile measure")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for --profile measure (1: as each worker of bench scaling)")
    parser.add_argument("--save-profile", metavar="FILE", help="write the profile as JSON")
    parser.add_argument("--links", default="all",
                        help=f"comma list of {', '.join(LINKS)}, 'all', a bench allreduce JSON file, "
                             f"or NAME:ALPHA_US:GBPS")
    parser.add_argument("--workers", default="1..1024,3", help="e.g. 1..1024 (powers of two), 1,2,3,4")
    parser.add_argument("--algo", default="ring,ps", help="comma list of ring, ps")
    parser.add_argument("--overlap", choices=("both", "on", "off"), default="both")
    parser.add_argument("--bucket-cap-mb", type=float, default=DEFAULT_CAP_MB)
    parser.add_argument("--first-bucket-cap-mb", type=float, default=DEFAULT_FIRST_CAP_MB)
    parser.add_argument("--validate", metavar="FILE",
                        help="JSON list of measured points (workers, algo, overlap, step_s) to predict")
    parser.add_argument("--json", metavar="FILE", help="write the table as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the speedup curves")


def build_profile(ns: argparse.Namespace) -> Profile:
    """The profile --profile asks for: loaded, measured here, or derived from FLOPs."""
    if ns.profile not in ("measure", "flops"):
        return load_profile(ns.profile)
    if ns.batch < 1:
        raise UsageError("--batch must be positive")
    try:
        from .models import build_model
    except ImportError:
        raise UsageError("ringsgd.models is not available in this installation: pass --profile FILE.json") from None
    import torch

    torch.manual_seed(0)
    shape = MODEL_INPUTS[ns.model]
    model = build_model(ns.model, shape[0], 10, shape[1])
    if ns.profile == "measure":
        if ns.threads < 1:
            raise UsageError("--threads must be at least 1")
        torch.set_num_threads(ns.threads)  # as one worker of the run it is compared with
        profile = profile_model(model, shape, ns.batch, steps=ns.steps)
    else:
        if ns.gpu_tflops <= 0 or not 0 < ns.efficiency <= 1:
            raise UsageError("--gpu-tflops must be positive and --efficiency in (0, 1]")
        profile = flops_profile(model, shape, ns.batch, ns.gpu_tflops * 1e12 * ns.efficiency)
        profile.meta.update(gpu_tflops=ns.gpu_tflops, efficiency=ns.efficiency)
    profile.meta["model"] = ns.model
    return profile


def _describe(profile: Profile, cap: int, first: int | None) -> str:
    from .bench.common import human_bytes

    meta = profile.meta
    how = meta.get("method", "file")
    if how == "flops":
        how = f"flops @ {meta['flops_per_s'] / 1e12:.2f} TFLOP/s effective"
    elif how == "measure":
        how = f"measured here, {meta.get('threads')} thread(s)"
    plan = assign_buckets([g.nbytes for g in profile.in_registration_order()], cap, first)
    return (f"# simulate: {meta.get('model', 'model')}, batch {profile.batch}/worker, {how}: forward "
            f"{profile.forward_s * 1e3:.3f} ms, backward {profile.backward_s * 1e3:.3f} ms, optimizer "
            f"{profile.optimizer_s * 1e3:.3f} ms; gradients {human_bytes(profile.grad_bytes)} in "
            f"{len(plan)} bucket(s)")


def run_from_args(ns: argparse.Namespace) -> int:
    """`ringsgd simulate`: the exit status for the CLI (the work is run_simulation's)."""
    run_simulation(ns)
    return 0


def run_simulation(ns: argparse.Namespace) -> dict:
    """Print speedup and efficiency per link, algorithm and overlap mode; return what --json writes."""
    from .bench.common import machine_info, print_table, write_json

    if ns.bucket_cap_mb <= 0 or ns.first_bucket_cap_mb <= 0:
        raise UsageError("--bucket-cap-mb and --first-bucket-cap-mb must be positive")
    cap, first = int(ns.bucket_cap_mb * MIB), int(ns.first_bucket_cap_mb * MIB)
    algos = [a.strip() for a in ns.algo.split(",") if a.strip()]
    for a in algos:
        _cost_fn(a)
    if not algos:
        raise UsageError("no algorithm given: use --algo ring,ps")
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[ns.overlap]
    workers = parse_workers(ns.workers)
    links = parse_links(ns.links)
    profile = build_profile(ns)
    if ns.save_profile:
        save_profile(profile, ns.save_profile)
        print(f"wrote {ns.save_profile}")
    table = speedup_table(profile, workers, algos, links, modes, cap, first)
    print(_describe(profile, cap, first))
    combos = [(a, o) for a in algos for o in modes]
    for link in links:
        print(f"\n# {link.describe()}; speedup = n t(1) / t(n), eff = speedup / n; "
              f"'ovl' overlaps backward, 'seq' reduces after it")
        headers = ["workers"] + [f"{a} {'ovl' if o else 'seq'} {k}" for a, o in combos for k in ("x", "eff")]
        by = {(r["workers"], r["algo"], r["overlap"]): r for r in table if r["link"] == link.name}
        lines = []
        for n in workers:
            line = [n]
            for a, o in combos:
                r = by[(n, a, o)]
                line += [f"{r['speedup']:.2f}", f"{r['efficiency'] * 100:.0f}%"]
            lines.append(line)
        print_table(headers, lines)
    payload = {"benchmark": "simulate", "profile": profile.to_dict(), "links": [asdict(l) for l in links],
               "bucket_cap_bytes": cap, "first_cap_bytes": first, "machine": machine_info(), "results": table}
    if ns.validate:
        payload["validation"] = _run_validation(ns.validate, profile, links, cap, first)
    write_json(ns.json, payload)
    if ns.plot:
        plot_speedups(table, ns.plot)
        print(f"wrote {ns.plot}")
    return payload


def _run_validation(path: str, profile: Profile, links: list[Link], cap: int, first: int) -> list[dict]:
    from .bench.common import print_table
    from .launch import cpu_count

    data = _read_json(path)
    points = data.get("results", data.get("points")) if isinstance(data, dict) else data
    if not isinstance(points, list):
        raise UsageError(f"{path} holds no list of measured points")
    cores = cpu_count() if profile.meta.get("method") == "measure" else None
    # a point trained with another per-worker batch (strong scaling) is not this profile's step
    same = [m for m in points if "global_batch" not in m or m["global_batch"] == profile.batch * int(m["workers"])]
    if len(same) < len(points):
        print(f"\n(skipping {len(points) - len(same)} measured point(s) whose per-worker batch is not {profile.batch})")
    # torch.distributed's own all-reduce runs gloo's algorithm of choice, which is not modelled here
    modelled = [m for m in same if m.get("algo") in COSTS]
    if len(modelled) < len(same):
        print(f"(skipping {len(same) - len(modelled)} point(s) of algorithms without a cost model: "
              f"{', '.join(sorted({str(m.get('algo')) for m in same} - set(COSTS)))})")
    # Compute is an input of the model, not what it predicts: scale the profile so the 1-worker
    # step matches the same run's measured 1-worker step (a shared machine drifts by 20% over
    # minutes), then judge the communication and overlap model on the other points.
    one = [m for m in modelled if int(m["workers"]) == 1]
    factor = 1.0
    if one:
        factor = float(one[0]["step_s"]) / simulate_step(profile, 1, one[0]["algo"], links[0], True, cap,
                                                         first)["step_s"]
        profile = scale_profile(profile, factor)
    rows = validate(modelled, profile, links, cap, first, cores)
    print(f"\n# validation against {path}; compute profile scaled x{factor:.3f} to the measured 1-worker step; "
          f"'saturated': every core computes, so communication is not hidden")
    for r in rows:
        r["profile_scale"] = factor
    print_table(["workers", "algo", "overlap", "link", "saturated", "slowdown", "measured ms", "predicted ms",
                 "error"],
                [[r["workers"], r["algo"], "on" if r["overlap"] else "off", r["link"],
                  "yes" if r["cpu_saturated"] else "no", f"{r['compute_slowdown']:.2f}",
                  f"{r['measured_s'] * 1e3:.2f}", f"{r['predicted_s'] * 1e3:.2f}", f"{r['rel_error'] * 100:+.0f}%"]
                 for r in rows])
    return rows
