"""Helpers the benchmarks share: size parsing, cross-rank timing, tables, JSON output."""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time

import torch
import torch.distributed as dist

from ..errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"cannot read size {text!r}: write e.g. 4096, 4KiB, 64MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_ints(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; for --workers lists."""
    try:
        return [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"expected a comma-separated list of integers, got {text!r}") from None


def parse_sizes(text: str, factor: int = 2) -> list[int]:
    """'4KiB..64MiB' (geometric, x`factor`) or '4KiB,1MiB,64MiB' -> byte counts."""
    if ".." in text:
        lo, hi = (parse_size(t) for t in text.split("..", 1))
        if lo <= 0 or hi < lo:
            raise UsageError(f"size range {text!r} must be low..high with 0 < low <= high")
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= factor
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" or n == int(n) else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n}"


def slowest_rank(seconds: float) -> float:
    """A collective is as slow as its slowest rank: max over the group."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def median(xs) -> float:
    return float(statistics.median(xs))


def machine_info() -> dict:
    return {"host": platform.node(), "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": len(os.sched_getaffinity(0)), "date": time.strftime("%Y-%m-%d")}


def print_table(headers: list[str], rows: list[list], file=None) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    print(line, file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), file=file)


def write_json(path: str | None, payload: dict) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")
