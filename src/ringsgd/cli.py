"""`ringsgd` command line: train, bench, simulate, timeline.

User errors (bad flags, missing files, dead workers) print one line `ringsgd: error: ...` and exit
non-zero; a traceback is only shown for bugs, or with RINGSGD_DEBUG=1.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from .errors import RingSGDError, WorkerFailure


def _train_args(p: argparse.ArgumentParser) -> None:
    from .train import TrainConfig
    d = TrainConfig()
    p.add_argument("--dataset", default=d.dataset, help="digits (ships with scikit-learn), mnist or cifar10")
    p.add_argument("--data-dir", default=None, help="directory with the MNIST IDX files or CIFAR-10 python batches")
    p.add_argument("--model", default=None, help="lenet, cifar10_quick or resnet20 (default: the data set's net)")
    p.add_argument("--workers", type=int, default=d.workers, help="processes on this machine (ignored under torchrun)")
    p.add_argument("--algo", default=d.algo, help="gradient all-reduce: ring, ps or native")
    p.add_argument("--global-batch", type=int, default=d.global_batch, help="samples per step over all workers")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate for a global batch of 64; scaled linearly")
    p.add_argument("--momentum", type=float, default=d.momentum)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--no-overlap", action="store_true", help="all-reduce after backward instead of during it")
    p.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    p.add_argument("--device", default=d.device, help="cpu (gloo) or cuda (nccl, one GPU per worker)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds any collective may take before failing")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per worker (default: cores / workers)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (0: pick a free one)")
    p.add_argument("--timeline", default=None, help="write a Chrome trace of every rank to this file")
    p.add_argument("--check-sync-every", type=int, default=0, help="verify replicas are identical every K steps")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)


def _train_config(ns: argparse.Namespace):
    from .train import TrainConfig
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    kw = {k: v for k, v in vars(ns).items() if k in fields}
    return TrainConfig(**kw, overlap=not ns.no_overlap, progress=not ns.no_progress)


def cmd_train(ns) -> int:
    from .train import train
    cfg = _train_config(ns)
    if cfg.out is None:
        cfg.out = os.path.join("runs", f"{cfg.dataset}-{cfg.algo}-x{cfg.workers}")
    summary = train(cfg)
    last = summary["history"][-1] if summary["history"] else {}
    if "test_accuracy" in last:
        print(f"final test accuracy {100 * last['test_accuracy']:.2f}% after {summary['steps']} steps; "
              f"{last['samples_per_s']:.0f} samples/s in the last epoch; outputs in {cfg.out}")
    return 0


def cmd_bench_allreduce(ns) -> int:
    from .bench import allreduce
    from .bench.common import parse_ints, parse_sizes
    from .comm import parse_algorithms
    algos = parse_algorithms(ns.algo)
    for workers in parse_ints(ns.workers):
        allreduce.run(workers, algos, parse_sizes(ns.sizes, ns.factor), iters=ns.iters, warmup=ns.warmup,
                      dtype=ns.dtype, json_path=_per_n(ns.json, workers, ns.workers), timeout=ns.timeout)
    return 0


def _per_n(path: str | None, n: int, spec: str) -> str | None:
    """One JSON per worker count when several are given: out.json -> out-n4.json."""
    if not path or "," not in str(spec):
        return path
    root, ext = os.path.splitext(path)
    return f"{root}-n{n}{ext or '.json'}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringsgd", description="Data-parallel CNN training on a ring all-reduce.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a CNN on N workers")
    _train_args(p)
    p.add_argument("--out", default=None, help="run directory: metrics, curves, checkpoints (default runs/...)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.set_defaults(fn=cmd_train)

    bench = sub.add_parser("bench", help="benchmarks (print a table, write JSON)").add_subparsers(
        dest="bench", required=True)
    p = bench.add_parser("allreduce", help="all-reduce time and bus bandwidth per size, nccl-tests style")
    p.add_argument("--workers", default="2", help="worker count, or a list like 2,4")
    p.add_argument("--algo", default="ring,ps,native")
    p.add_argument("--sizes", default="4KiB..64MiB", help="low..high (x --factor) or a comma list")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", default=None)
    p.set_defaults(fn=cmd_bench_allreduce)

    _module_command(bench, "step", "ringsgd.bench.step", "one training step split into compute and communication")
    _module_command(bench, "scaling", "ringsgd.bench.scaling", "speed-up and accuracy at 1/2/4 workers")
    _module_command(sub, "simulate", "ringsgd.simulate", "alpha-beta cost model of a step, N = 1..1024")
    tl = sub.add_parser("timeline", help="inspect a --timeline trace").add_subparsers(dest="tl", required=True)
    _module_command(tl, "summarize", "ringsgd.timeline_summary",
                    "per-rank compute / exposed communication / idle, and a Gantt PNG")
    return parser


def _module_command(subparsers, name: str, module: str, help_: str) -> None:
    """A subcommand whose options and body live in `module` (add_arguments, run_from_args)."""
    import importlib
    mod = importlib.import_module(module)
    p = subparsers.add_parser(name, help=help_)
    mod.add_arguments(p)
    p.set_defaults(fn=mod.run_from_args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return ns.fn(ns)
    except KeyboardInterrupt:
        print("ringsgd: interrupted", file=sys.stderr)
        return 130
    except RingSGDError as e:
        if os.environ.get("RINGSGD_DEBUG"):
            raise
        text = str(e)
        if isinstance(e, WorkerFailure):
            print(f"ringsgd: error: {text}", file=sys.stderr)
            return 1
        print(f"ringsgd: error: {text.splitlines()[0] if text else type(e).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
