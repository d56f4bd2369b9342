"""Data-parallel SGD training: the loop every worker runs, and `train(cfg)` that launches them.

Each worker loads the same data set, builds the same model (rank 0's weights are broadcast), wraps it
in RingDataParallel, and trains on its shard of every global batch; the wrapper averages gradients in
backward, so the optimizer step is identical everywhere. Rank 0 evaluates, writes metrics, curves and
checkpoints. Learning-rate rule (linear scaling, Goyal et al. 2017): lr = --lr * global_batch / 64,
so --lr is the rate for a global batch of 64 and changing the batch keeps the per-sample step.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import checkpoint, timeline
from .data import ShardedBatchSampler, load_dataset
from .errors import RingSGDError, UsageError
from .launch import backend_for, check_workers, launch
from .models import build_model, default_model
from .parallel import RingDataParallel

LR_REF_BATCH = 64
FAULTS = ("kill", "raise", "nan", "diverge")


@dataclasses.dataclass
class TrainConfig:
    dataset: str = "digits"
    data_dir: str | None = None
    model: str | None = None  # default: the data set's classic net (lenet / cifar10_quick)
    workers: int = 2
    algo: str = "ring"
    global_batch: int = 64
    epochs: int = 10
    lr: float = 0.01  # for a global batch of LR_REF_BATCH (Caffe LeNet's base_lr); scaled linearly
    momentum: float = 0.9
    weight_decay: float = 5e-4
    overlap: bool = True
    bucket_cap_mb: float = 25.0
    device: str = "cpu"
    out: str | None = None
    resume: bool = False
    seed: int = 0
    timeout: float = 60.0
    threads: int | None = None
    max_steps: int | None = None  # stop after this many optimizer steps in all (benchmarks, tests)
    evaluate: bool = True
    timeline: str | None = None
    check_sync_every: int = 0
    progress: bool = True
    port: int = 0
    inject_fault: str | None = None  # KIND@RANK:STEP, KIND in kill|raise|nan|diverge: reliability tests

    @property
    def effective_lr(self) -> float:
        return self.lr * self.global_batch / LR_REF_BATCH


def validate(cfg: TrainConfig) -> TrainConfig:
    """Refuse bad settings before any process starts, each with one sentence."""
    from .comm import get_algorithm
    from .data import DATASETS

    if cfg.dataset not in DATASETS:
        raise UsageError(f"unknown dataset {cfg.dataset!r}: use one of {', '.join(DATASETS)}")
    get_algorithm(cfg.algo)
    check_workers(cfg.workers)
    if cfg.global_batch < 1:
        raise UsageError(f"global batch must be positive, got {cfg.global_batch}")
    if cfg.global_batch % cfg.workers:
        lo = cfg.global_batch // cfg.workers * cfg.workers
        hint = f"{lo} or {lo + cfg.workers}" if lo else f"{cfg.workers}"
        raise UsageError(f"global batch {cfg.global_batch} does not split evenly over {cfg.workers} workers "
                         f"(each worker takes global_batch / workers samples): use e.g. {hint}")
    if cfg.epochs < 1:
        raise UsageError(f"epochs must be at least 1, got {cfg.epochs}")
    if cfg.lr <= 0:
        raise UsageError(f"learning rate must be positive, got {cfg.lr}")
    if cfg.timeout <= 0:
        raise UsageError(f"timeout must be positive, got {cfg.timeout}")
    backend_for(cfg.device)
    if cfg.device == "cuda":
        if cfg.workers > torch.cuda.device_count():
            raise UsageError(f"{cfg.workers} workers need {cfg.workers} GPUs, found {torch.cuda.device_count()}")
    if cfg.data_dir is not None and not os.path.isdir(cfg.data_dir):
        raise UsageError(f"data directory {cfg.data_dir} does not exist")
    if cfg.resume and not cfg.out:
        raise UsageError("--resume needs --out, the run directory holding the checkpoints")
    if cfg.inject_fault:
        _parse_fault(cfg.inject_fault)
    return cfg


def train(cfg: TrainConfig) -> dict:
    """Launch `cfg.workers` processes (or join torchrun's) and train; returns rank 0's summary."""
    validate(cfg)
    results = launch(train_worker, workers=cfg.workers, backend=backend_for(cfg.device), args=(cfg,),
                     timeout=cfg.timeout, port=cfg.port, threads=cfg.threads)
    summary = results[0]
    if len(results) > 1:
        summary["rank_hashes"] = [r["param_hash"] for r in results]
    return summary


def param_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _parse_fault(spec: str) -> tuple[str, int, int]:
    try:
        kind, where = spec.split("@")
        rank, step = where.split(":")
        if kind not in FAULTS:
            raise ValueError
        return kind, int(rank), int(step)
    except ValueError:
        raise UsageError(f"--inject-fault {spec!r}: write KIND@RANK:STEP with KIND one of {', '.join(FAULTS)}") from None


def train_worker(cfg: TrainConfig) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    lead = rank == 0
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
    if cfg.timeline:
        timeline.start(rank)
    torch.manual_seed(cfg.seed)
    ds = load_dataset(cfg.dataset, cfg.data_dir)
    model_name = cfg.model or default_model(cfg.dataset)
    model = build_model(model_name, ds.in_channels, ds.num_classes, ds.image_size).to(device)
    net = RingDataParallel(model, algo=cfg.algo, overlap=cfg.overlap, bucket_cap_mb=cfg.bucket_cap_mb,
                           timeout=cfg.timeout)
    opt = torch.optim.SGD(net.parameters(), lr=cfg.effective_lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    sampler = ShardedBatchSampler(len(ds.train_y), cfg.global_batch, rank, world, seed=cfg.seed)
    train_x, train_y = ds.train_x.to(device), ds.train_y.to(device)
    fault = _parse_fault(cfg.inject_fault) if cfg.inject_fault else None

    history: list[dict] = []
    start_epoch, step = 0, 0
    if cfg.resume:
        step, history = _resume(cfg, model, opt, sampler)
        start_epoch = sampler.state_dict()["epoch"]
    total_steps = cfg.epochs * len(sampler)
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    bar = None
    if lead and cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=total_steps, initial=min(step, total_steps), unit="step", dynamic_ncols=True,
                   desc=f"{cfg.dataset} {model_name} x{world} {cfg.algo}")
    timing = dict.fromkeys(("data", "forward", "backward", "wait", "comm", "optimizer", "step"), 0.0)
    timed_steps = 0
    for epoch in range(start_epoch, cfg.epochs):
        if step >= total_steps:
            break
        sampler.set_epoch(epoch)
        net.train()
        loss_sum, seen, t_epoch = 0.0, 0, time.perf_counter()
        for idx in sampler:
            t0 = time.perf_counter()
            with timeline.span("step", "compute", step=step):
                with timeline.span("data", "data"):
                    idx = idx.to(device)
                    x, y = train_x[idx], train_y[idx]
                t1 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with timeline.span("forward", "compute"):
                    loss = F.cross_entropy(net(x), y)
                faulty = fault is not None and fault[1:] == (rank, step)
                if faulty:
                    loss = _inject(fault[0], loss, rank, step)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at epoch {epoch + 1}, step {step} on rank "
                                             f"{rank}: lower --lr or check the data")
                t2 = time.perf_counter()
                wait0, comm0 = net.wait_seconds, net.comm_seconds
                with timeline.span("backward", "compute"):
                    loss.backward()
                t3 = time.perf_counter()
                with timeline.span("optimizer", "optimizer"):
                    opt.step()
                if faulty and fault[0] == "diverge":  # this replica silently drifts from the others
                    with torch.no_grad():
                        next(net.module.parameters()).add_(1e-3)
                t4 = time.perf_counter()
            timing["data"] += t1 - t0
            timing["forward"] += t2 - t1
            timing["backward"] += t3 - t2
            timing["wait"] += net.wait_seconds - wait0
            timing["comm"] += net.comm_seconds - comm0
            timing["optimizer"] += t4 - t3
            timing["step"] += t4 - t0
            timed_steps += 1
            loss_sum += loss.item() * len(idx)
            seen += len(idx)
            step += 1
            if cfg.check_sync_every and step % cfg.check_sync_every == 0:
                _check_in_sync(net.module, step)
            if bar is not None:
                bar.update(1)
                elapsed = time.perf_counter() - t_epoch
                bar.set_postfix(loss=f"{loss.item():.3f}", samples_s=f"{seen * world / elapsed:.0f}")
            if step >= total_steps:  # before the sampler hands out a batch we would not train on
                break
        epoch_s = time.perf_counter() - t_epoch
        complete = sampler.state_dict()["epoch"] > epoch
        record = {"epoch": epoch + 1, "complete": complete, "step": step,
                  "train_loss": _global_mean(loss_sum, seen, device),
                  "epoch_seconds": epoch_s, "samples_per_s": seen * world / epoch_s if epoch_s else 0.0}
        if cfg.evaluate:
            record.update(evaluate(net.module, ds.test_x, ds.test_y, device))
        history.append(record)
        if lead:
            msg = f"epoch {epoch + 1}/{cfg.epochs}: loss {record['train_loss']:.4f}"
            if "test_accuracy" in record:
                msg += f", test accuracy {100 * record['test_accuracy']:.2f}%"
            msg += f", {record['samples_per_s']:.0f} samples/s"
            (bar.write if bar is not None else print)(msg)
            if cfg.out:
                _write_outputs(cfg, history, model_name, world, param_hash(model))
                # the sampler's own position: the next batch to train on, mid-epoch if we stopped there
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1,
                         "step": step, "sampler": sampler.state_dict(), "history": history,
                         "rng": torch.get_rng_state(), "config": dataclasses.asdict(cfg)}
                checkpoint.save(state, os.path.join(cfg.out, "checkpoints"), epoch + 1)
        if cfg.out:
            dist.barrier()  # the checkpoint is on disk before anyone starts the next epoch
    if bar is not None:
        bar.close()
    result = {"rank": rank, "param_hash": param_hash(net.module), "steps": step, "timed_steps": timed_steps,
              "timing": timing, "history": history, "model": model_name, "workers": world,
              "threads": torch.get_num_threads(), "buckets": net.bucket_sizes()}
    if cfg.timeline:
        _gather_timeline(cfg.timeline, lead)
    return result


def evaluate(model: torch.nn.Module, test_x: torch.Tensor, test_y: torch.Tensor, device) -> dict:
    """Test loss and accuracy: each rank scores its slice of the test set, then the counts are summed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor_split(torch.arange(len(test_y)), world)[rank]
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad(), timeline.span("evaluate", "eval"):
        for part in torch.split(mine, 512):
            x, y = test_x[part].to(device), test_y[part].to(device)
            logits = model(x)
            totals[0] += F.cross_entropy(logits, y, reduction="sum").item()
            totals[1] += (logits.argmax(1) == y).sum().item()
            totals[2] += len(part)
    model.train()
    dist.all_reduce(totals)
    return {"test_loss": float(totals[0] / totals[2]), "test_accuracy": float(totals[1] / totals[2])}


def _global_mean(total: float, count: int, device) -> float:
    t = torch.tensor([total, count], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[1]) if t[1] else float("nan")


def _check_in_sync(model: torch.nn.Module, step: int) -> None:
    hashes: list = [None] * dist.get_world_size()
    dist.all_gather_object(hashes, param_hash(model))
    bad = [r for r, h in enumerate(hashes) if h != hashes[0]]
    if bad:
        raise RingSGDError(f"replicas diverged at step {step}: parameters on rank(s) {bad} differ from rank 0's")


def _inject(kind: str, loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """Fault injection for reliability tests: a crash, a bug, a bad batch ("diverge" acts after the step)."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    return loss * float("nan") if kind == "nan" else loss


def _resume(cfg: TrainConfig, model, opt, sampler: ShardedBatchSampler) -> tuple[int, list]:
    """Rank 0 reads the newest checkpoint and sends it to everyone (no shared disk needed)."""
    payload: list = [None]
    if dist.get_rank() == 0:
        path = checkpoint.latest(os.path.join(cfg.out, "checkpoints"))
        if path is None:
            payload[0] = f"--resume: no checkpoint in {os.path.join(cfg.out, 'checkpoints')}"
        else:
            try:
                payload[0] = checkpoint.load(path)
                print(f"resuming from {path} (epoch {payload[0]['epoch']}, step {payload[0]['step']})", flush=True)
            except RingSGDError as e:
                payload[0] = str(e)
    dist.broadcast_object_list(payload, src=0)
    state = payload[0]
    if isinstance(state, str):
        from .errors import CheckpointError
        raise CheckpointError(state)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"])
    return state["step"], state["history"]


def _write_outputs(cfg: TrainConfig, history: list[dict], model_name: str, world: int, params_sha256: str) -> None:
    """metrics.json (with a hash of the parameters, to compare runs), metrics.csv, curves.png."""
    os.makedirs(cfg.out, exist_ok=True)
    meta = {"config": dataclasses.asdict(cfg), "model": model_name, "workers": world,
            "effective_lr": cfg.effective_lr, "history": history, "params_sha256": params_sha256}
    _atomic_write(os.path.join(cfg.out, "metrics.json"), json.dumps(meta, indent=2))
    tmp = os.path.join(cfg.out, "metrics.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for h in history for k in h)))
        w.writeheader()
        w.writerows(history)
    os.replace(tmp, os.path.join(cfg.out, "metrics.csv"))
    plot_curves(history, os.path.join(cfg.out, "curves.png"), title=f"{cfg.dataset} {model_name}, "
                f"{world} workers, {cfg.algo}")


def _atomic_write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def plot_curves(history: list[dict], path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    if "test_loss" in history[0]:
        a.plot(epochs, [h["test_loss"] for h in history], "s-", label="test")
        b.plot(epochs, [100 * h["test_accuracy"] for h in history], "o-", color="C2")
    a.set(xlabel="epoch", ylabel="loss", title="loss")
    a.legend()
    b.set(xlabel="epoch", ylabel="test accuracy (%)", title="accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def _gather_timeline(path: str, lead: bool) -> None:
    rec = timeline.stop()
    events: list = [None] * dist.get_world_size()
    dist.all_gather_object(events, rec.trace() if rec else [])
    if lead:
        timeline.write(path, events)
        print(f"wrote timeline {path}", flush=True)
