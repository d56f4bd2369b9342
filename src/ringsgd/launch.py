"""Start N workers on this machine, or join the ones torchrun started, and watch them.

`launch(fn, workers=N)` spawns N processes. The parent hosts the rendezvous store on a loopback port
the OS picks (no race for a "free" port), so the children only connect to it. The parent then watches
the children: the first one to die is named, with its exit code or signal, in the store (so the
survivors can say whom they lost) and in the `WorkerFailure` raised here; survivors get a grace period
to fail on their own, then are terminated. Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR set) the same
`fn` runs in the current process on env:// initialisation, so one program serves both.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

from .errors import CommError, UsageError, WorkerFailure

MAX_WORKERS = 256
FAILED_KEY = "ringsgd/failed"
GRACE_S = 5.0  # after one worker died, how long the others may take to notice and exit


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_worker(workers: int) -> int:
    """CPU threads for each worker: the cores split evenly, at least one."""
    return max(1, cpu_count() // max(1, workers))


def check_workers(workers) -> int:
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"workers must be an integer from 1 to {MAX_WORKERS}, got {workers!r}")
    return workers


def check_backend(backend: str) -> str:
    if backend not in ("gloo", "nccl"):
        raise UsageError(f"unknown backend {backend!r}: use 'gloo' (CPU) or 'nccl' (GPU)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("backend 'nccl' needs CUDA GPUs, and none is available: use backend='gloo'")
    return backend


def backend_for(device: str) -> str:
    """The process-group backend a device needs: gloo for cpu, nccl for cuda (which must exist)."""
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}: use cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but no CUDA GPU is available: use --device cpu")
    return check_backend("nccl" if device == "cuda" else "gloo")


def launch(fn, workers: int = 2, backend: str = "gloo", args: tuple = (), timeout: float = 60.0,
           port: int = 0, threads: int | None = None) -> list:
    """Run `fn(*args)` on `workers` ranks with torch.distributed initialised; return each rank's result.

    `fn` must be a module-level function (spawned processes import it by name). `timeout` bounds the
    rendezvous and every collective. Under torchrun, runs `fn` on this process's rank and returns
    `[result]`. Raises WorkerFailure naming the failed ranks if any worker fails.
    """
    check_backend(backend)
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _init(backend, rank, world, None, timeout, threads or threads_per_worker(
            int(os.environ.get("LOCAL_WORLD_SIZE", world))))
        try:
            return [fn(*args)]
        finally:
            dist.destroy_process_group()
    check_workers(workers)
    if not 0 <= port <= 65535:
        raise UsageError(f"port must be 0 (pick a free one) or 1..65535, got {port}")
    try:
        store = dist.TCPStore("127.0.0.1", port, workers + 1, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, OSError) as e:
        raise UsageError(f"cannot listen on 127.0.0.1:{port} ({e}): the port is in use; "
                         "pass port 0 to pick a free one") from None
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ringsgd-") as outdir:
        procs = []
        for rank in range(workers):
            p = ctx.Process(target=_worker, name=f"ringsgd-rank{rank}", daemon=False,
                            args=(fn, args, rank, workers, backend, store.port, timeout,
                                  threads or threads_per_worker(workers), outdir))
            try:
                p.start()
            except (pickle.PicklingError, AttributeError, TypeError) as e:
                _stop(procs)
                raise UsageError(f"cannot start workers: {e} (fn and args must be picklable; "
                                 "use a module-level function)") from None
            procs.append(p)
        try:
            failures = _watch(procs, store)
        except BaseException:  # Ctrl-C or a bug here: never leave workers running behind us
            _stop(procs)
            raise
        if failures:
            user_error = _user_error(failures[0][0], outdir)
            if user_error is not None:  # bad input found inside a worker: the same clear error here
                raise user_error
            raise WorkerFailure(_describe(failures, outdir))
        return [_load(os.path.join(outdir, f"{rank}.result")) for rank in range(workers)]


def _watch(procs, store) -> list[tuple[int, int]]:
    """Wait for every worker; on the first failure, tell the others and stop them after a grace period."""
    failures: list[tuple[int, int]] = []
    alive = {p.sentinel: (rank, p) for rank, p in enumerate(procs)}
    deadline = None
    while alive:
        wait_s = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        for s in multiprocessing.connection.wait(list(alive), timeout=wait_s):
            rank, p = alive.pop(s)
            p.join()
            if p.exitcode != 0:
                failures.append((rank, p.exitcode))
                if deadline is None:
                    store.set(FAILED_KEY, f"rank {rank} ({_exit_text(p.exitcode)})")
                    deadline = time.monotonic() + GRACE_S
        if deadline is not None and time.monotonic() >= deadline and alive:
            for rank, p in alive.values():
                failures.append((rank, -signal.SIGTERM))
            _stop([p for _, p in alive.values()])
            alive.clear()
    return failures


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(3)
        if p.is_alive():
            p.kill()
            p.join()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _describe(failures, outdir) -> str:
    first_rank, first_code = failures[0]
    lines = [f"worker {first_rank} failed first ({_exit_text(first_code)})"]
    err = os.path.join(outdir, f"{first_rank}.error")
    if os.path.exists(err):
        lines.append(open(err).read().rstrip())
    others = [f"{r} ({_exit_text(c)})" for r, c in failures[1:]]
    if others:
        lines.append("then: " + ", ".join(others))
    return "\n".join(lines)


def _user_error(rank: int, outdir: str):
    path = os.path.join(outdir, f"{rank}.usage")
    return _load(path) if os.path.exists(path) else None


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _init(backend, rank, world, store, timeout, threads) -> None:
    if store is not None:  # our own launch is single-machine: keep gloo on loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(threads)
    kw = dict(backend=backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout))
    if store is not None:
        kw["store"] = store
    else:
        kw["init_method"] = "env://"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(**kw)


def _worker(fn, args, rank, world, backend, port, timeout, threads, outdir) -> None:
    code = 0
    store = None
    try:
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        _init(backend, rank, world, dist.PrefixStore("pg", store), timeout, threads)
        result = fn(*args)
        tmp = os.path.join(outdir, f"{rank}.result.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(result, f)
        os.replace(tmp, os.path.join(outdir, f"{rank}.result"))
        dist.destroy_process_group()
    except BaseException as e:  # report, then leave at once: a wedged collective must not keep us
        code = 1
        msg = f"[rank {rank}] {type(e).__name__}: {e}"
        lost = _lost_peer(store, e)
        if lost:
            msg += f"\n[rank {rank}] lost peer: {lost}"
        with open(os.path.join(outdir, f"{rank}.error"), "w") as f:
            f.write(msg + "\n" + "".join(traceback.format_exception(e)))
        if isinstance(e, UsageError):  # printed once, by the launcher, which raises it again
            with open(os.path.join(outdir, f"{rank}.usage"), "wb") as f:
                pickle.dump(e, f)
        else:
            print(msg, file=sys.stderr, flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _lost_peer(store, exc) -> str | None:
    """If a peer died, the launcher has written who into the store; wait briefly for it."""
    if store is None or not isinstance(exc, (CommError, RuntimeError)):
        return None
    try:
        store.wait([FAILED_KEY], datetime.timedelta(seconds=2))
        return store.get(FAILED_KEY).decode()
    except Exception:
        return None
