"""`ringsgd bench scaling`: the paper's table — speed-up and accuracy at 1, 2, 4 workers.

Every configuration trains for the same number of epochs (so the same number of samples) and is
timed on its training steps only (no start-up, no evaluation). Two regimes, labelled apart:
  weak    fixed per-worker batch; the global batch (and, by the linear rule, the lr) grows with N
  strong  fixed global batch, split N ways
Speed-up is samples/s over the 1-worker run of the same regime. On a CPU the workers share the cores:
each worker gets `--threads` threads (1 by default), and a run with N * threads > cores is flagged
oversubscribed, because its "speed-up" then measures core sharing, not the algorithm.
"""
from __future__ import annotations


from .. import comm
from ..errors import UsageError
from ..launch import cpu_count
from ..train import TrainConfig, train
from .common import machine_info, parse_ints, print_table, write_json


def _measure(cfg: TrainConfig) -> dict:
    s = train(cfg)
    t = s["timing"]
    steps = max(1, s["timed_steps"])
    step_s = t["step"] / steps
    compute = t["forward"] + t["backward"] - t["wait"] + t["optimizer"]
    last = s["history"][-1]
    return {"workers": cfg.workers, "algo": cfg.algo, "overlap": cfg.overlap, "global_batch": cfg.global_batch,
            "threads": s["threads"], "steps": s["timed_steps"], "step_s": step_s,
            "samples_per_s": cfg.global_batch / step_s,
            "compute_share": compute / t["step"], "comm_exposed_share": t["wait"] / t["step"],
            "data_share": t["data"] / t["step"],
            "idle_share": max(0.0, 1 - (compute + t["wait"] + t["data"]) / t["step"]),
            "comm_s_per_step": t["comm"] / steps, "test_accuracy": last.get("test_accuracy"),
            "model": s["model"], "buckets": s["buckets"]}


def run(dataset="digits", data_dir=None, model=None, workers=(1, 2, 4), algos=("ring", "ps", "native"),
        overlap=True, regimes=("weak", "strong"), batch=32, epochs=3, lr=0.01, threads=1, seed=0,
        json_path=None, plot_path=None, timeline_path=None, progress=False, device="cpu") -> dict:
    cores = cpu_count()
    rows = []
    for regime in regimes:
        base = None
        for n in sorted(set(workers)):
            gb = batch * n if regime == "weak" else batch * max(workers)
            for algo in (algos if n > 1 else ("ring",)):  # one worker: no communication, one run serves all
                cfg = TrainConfig(dataset=dataset, data_dir=data_dir, model=model, workers=n, algo=algo,
                                  global_batch=gb, epochs=epochs, lr=lr, overlap=overlap, threads=threads,
                                  seed=seed, progress=progress, out=None, device=device,
                                  timeline=timeline_path.replace(".json", f"-{regime}-{algo}-n{n}.json")
                                  if timeline_path else None)
                print(f"[{regime}] {n} worker(s), {algo}, global batch {gb} ...", flush=True)
                r = _measure(cfg)
                r["regime"] = regime
                r["oversubscribed"] = n * r["threads"] > cores
                if n == 1:
                    base = r
                r["speedup"] = r["samples_per_s"] / base["samples_per_s"] if base else float("nan")
                r["efficiency"] = r["speedup"] / n
                r["accuracy_delta"] = (r["test_accuracy"] - base["test_accuracy"]) if base and \
                    r["test_accuracy"] is not None else None
                rows.append(r)
    _print(rows, dataset, epochs, cores)
    payload = {"benchmark": "scaling", "dataset": dataset, "device": device, "epochs": epochs, "batch": batch,
               "lr": lr,
               "threads_per_worker": threads, "cores": cores, "overlap": overlap, "machine": machine_info(),
               "paper": {"mnist_4gpu_speedup": 3.77, "cifar10_4gpu_speedup": 3.79}, "results": rows}
    write_json(json_path, payload)
    if plot_path:
        plot(rows, plot_path, f"{dataset}, {rows[0]['model']}, {epochs} epochs")
    return payload


def _print(rows, dataset, epochs, cores) -> None:
    print(f"# scaling on {dataset}, {epochs} epochs, {cores} cores (* = oversubscribed: workers x threads > cores)")
    print_table(["regime", "algo", "N", "global batch", "thr/worker", "samples/s", "speed-up", "efficiency",
                 "compute", "comm exposed", "idle", "test acc", "vs N=1"],
                [[r["regime"], r["algo"] if r["workers"] > 1 else "-", f"{r['workers']}{'*' if r['oversubscribed'] else ''}",
                  r["global_batch"], r["threads"], f"{r['samples_per_s']:.0f}", f"{r['speedup']:.2f}x",
                  f"{100 * r['efficiency']:.0f}%", f"{100 * r['compute_share']:.0f}%",
                  f"{100 * r['comm_exposed_share']:.0f}%", f"{100 * r['idle_share']:.0f}%",
                  f"{100 * r['test_accuracy']:.2f}%" if r["test_accuracy"] is not None else "-",
                  f"{100 * r['accuracy_delta']:+.2f}" if r["accuracy_delta"] is not None else "-"] for r in rows])


def plot(rows, path, title) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = sorted({r["regime"] for r in rows})
    fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 3.8), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        rs = [r for r in rows if r["regime"] == regime]
        ns = sorted({r["workers"] for r in rs})
        base = next(r for r in rs if r["workers"] == 1)
        ax.plot(ns, ns, "k--", lw=1, label="ideal")
        for algo in sorted({r["algo"] for r in rs if r["workers"] > 1}):
            pts = [base] + [r for r in rs if r["algo"] == algo and r["workers"] > 1]
            ax.plot([p["workers"] for p in pts], [p["speedup"] for p in pts], "o-", label=algo)
        for r in rs:
            if r["oversubscribed"]:
                ax.annotate("oversubscribed", (r["workers"], r["speedup"]), fontsize=7, alpha=0.6)
        ax.set(xlabel="workers", ylabel="speed-up (samples/s over 1 worker)", title=f"{regime} scaling",
               xticks=ns)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def add_arguments(p) -> None:
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--workers", default="1,2,4", help="comma list; 1 is always added as the baseline")
    p.add_argument("--algo", default="ring,ps,native")
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--regime", default="weak,strong", help="weak, strong or both")
    p.add_argument("--batch", type=int, default=32, help="per-worker batch (weak); global = batch x max N (strong)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per worker)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--timeline", default=None, help="write one trace per configuration (name-<config>.json)")


def run_from_args(ns) -> int:
    workers = sorted({1, *parse_ints(ns.workers)})
    algos = comm.parse_algorithms(ns.algo)
    regimes = [r.strip() for r in ns.regime.split(",") if r.strip()]
    if not set(regimes) <= {"weak", "strong"}:
        raise UsageError(f"--regime must be weak, strong or weak,strong, got {ns.regime!r}")
    run(ns.dataset, ns.data_dir, ns.model, workers, algos, not ns.no_overlap, regimes, ns.batch, ns.epochs, ns.lr,
        ns.threads, ns.seed, ns.json, ns.plot, ns.timeline, device=ns.device)
    return 0
