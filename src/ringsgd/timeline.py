"""Per-rank event recording in the Chrome trace format (chrome://tracing, Perfetto).

Recording is off unless `start()` was called in this process; then `span()` returns a shared no-op
context manager, so instrumented hot paths (the ring's inner loop) pay one global lookup.
Timestamps are time.perf_counter_ns (monotonic), in microseconds as the format wants.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time

# One row ("thread") per activity, so compute and communication sit on separate lanes.
ROWS = ("compute", "comm", "ring", "optimizer", "data", "wait", "eval")
_NULL = contextlib.nullcontext()
_REC: "Recorder | None" = None


class Recorder:
    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[dict] = []
        self._lock = threading.Lock()

    def now_us(self) -> float:
        return time.perf_counter_ns() / 1000.0

    def add(self, name: str, cat: str, start_us: float, end_us: float, args: dict | None = None) -> None:
        ev = {"name": name, "cat": cat, "ph": "X", "ts": start_us, "dur": max(0.0, end_us - start_us),
              "pid": self.rank, "tid": ROWS.index(cat) if cat in ROWS else len(ROWS)}
        if args:
            ev["args"] = args
        with self._lock:
            self.events.append(ev)

    @contextlib.contextmanager
    def span(self, name: str, cat: str, args: dict):
        t0 = self.now_us()
        try:
            yield
        finally:
            self.add(name, cat, t0, self.now_us(), args)

    def trace(self) -> list[dict]:
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": i, "args": {"name": row}}
                 for i, row in enumerate(ROWS)]
        return meta + self.events


def start(rank: int) -> Recorder:
    """Begin recording in this process (idempotent per rank)."""
    global _REC
    if _REC is None or _REC.rank != rank:
        _REC = Recorder(rank)
    return _REC


def stop() -> "Recorder | None":
    global _REC
    rec, _REC = _REC, None
    return rec


def active() -> "Recorder | None":
    return _REC


def span(name: str, cat: str, **args):
    """Context manager timing a block as one event; free when recording is off."""
    rec = _REC
    return _NULL if rec is None else rec.span(name, cat, args)


def write(path: str, per_rank_events: list[list[dict]]) -> None:
    """Merge every rank's events into one trace file, written atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    events = [e for evs in per_rank_events for e in evs]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)
