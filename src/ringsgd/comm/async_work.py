"""Asynchronous all-reduce: one communication thread per process, jobs run in FIFO order.

FIFO matters: every rank must run its collectives in the same order, and the trainer submits buckets
in the same order on every rank. The thread is a daemon and every wait has a timeout, so a dead peer
can never keep a worker alive. torch ops and gloo waits release the GIL, so backward (main thread)
and the ring (this thread) really run at the same time.
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Callable

import torch

from ..errors import CommError


class Handle:
    """The future result of an all-reduce started with `all_reduce_async`."""

    def __init__(self, future: concurrent.futures.Future, what: str):
        self._future = future
        self._what = what

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """Block until the all-reduce finished; raise CommError if it failed or took over `timeout` s."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise CommError(
                f"{self._what} did not finish within {timeout:g} s: a peer worker is probably dead or stuck"
            ) from None
        except CommError:
            raise
        except Exception as e:  # gloo reports a lost peer as RuntimeError("Connection closed ...")
            raise CommError(f"{self._what} failed: {e}") from e


class _CommThread:
    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="ringsgd-comm", daemon=True).start()

    def _run(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # handed to whoever waits
                    future.set_exception(e)

    def submit(self, fn: Callable[[], torch.Tensor]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn))
        return future


_THREAD: _CommThread | None = None
_THREAD_LOCK = threading.Lock()


def run_async(fn: Callable[[], torch.Tensor], what: str = "all-reduce") -> Handle:
    """Queue `fn` on this process's communication thread."""
    global _THREAD
    with _THREAD_LOCK:
        if _THREAD is None:
            _THREAD = _CommThread()
    return Handle(_THREAD.submit(fn), what)
