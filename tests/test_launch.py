"""Launcher: results come back, failures are named and bounded in time, never a hang."""
import os
import signal
import socket
import time

import pytest
import torch
import torch.distributed as dist

import ringsgd
from ringsgd import comm
from ringsgd.errors import UsageError, WorkerFailure


def _rank_and_world():
    return dist.get_rank(), dist.get_world_size(), torch.get_num_threads()


def test_results_come_back_in_rank_order():
    assert [r[:2] for r in ringsgd.launch(_rank_and_world, workers=3, timeout=30)] == [(0, 3), (1, 3), (2, 3)]


def _killed_mid_ring(victim, after):
    """Everyone all-reduces in a loop; `victim` SIGKILLs itself after `after` rounds."""
    x = torch.ones(1 << 16)
    for i in range(10_000):
        if dist.get_rank() == victim and i == after:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.ring_all_reduce(x, op="mean")


def test_killed_worker_is_named_and_the_others_end_within_the_timeout():
    timeout = 10.0
    t0 = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        ringsgd.launch(_killed_mid_ring, workers=3, args=(2, 20), timeout=timeout)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert "worker 2 failed first (killed by SIGKILL)" in msg
    assert elapsed < timeout + 10, f"survivors took {elapsed:.1f} s to go"


def _raises_on_rank_1():
    x = torch.ones(10)
    comm.ring_all_reduce(x)
    if dist.get_rank() == 1:
        raise FloatingPointError("loss is nan at step 3")
    comm.ring_all_reduce(x)  # the others block here until they learn rank 1 is gone


def test_exception_in_one_worker_reports_rank_and_traceback():
    t0 = time.monotonic()
    with pytest.raises(WorkerFailure) as info:
        ringsgd.launch(_raises_on_rank_1, workers=3, timeout=20)
    msg = str(info.value)
    assert "worker 1 failed first (exit code 1)" in msg
    assert "[rank 1] FloatingPointError: loss is nan at step 3" in msg
    assert "Traceback" in msg and "_raises_on_rank_1" in msg
    assert time.monotonic() - t0 < 20 + 10


def test_bad_worker_counts_and_backends_are_refused():
    for bad in (0, -1, 10_000, 2.5):
        with pytest.raises(UsageError, match="workers must be an integer"):
            ringsgd.launch(_rank_and_world, workers=bad)
    with pytest.raises(UsageError, match="unknown backend"):
        ringsgd.launch(_rank_and_world, workers=2, backend="mpi")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="needs CUDA"):
            ringsgd.launch(_rank_and_world, workers=2, backend="nccl")


def test_port_in_use_is_a_clear_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        with pytest.raises(UsageError, match="in use"):
            ringsgd.launch(_rank_and_world, workers=2, port=s.getsockname()[1], timeout=10)
    finally:
        s.close()


def test_unpicklable_function_is_a_clear_error():
    with pytest.raises(UsageError, match="module-level function"):
        ringsgd.launch(lambda: 1, workers=2, timeout=10)
