"""How gradients are grouped into buckets: a pure function, shared by the trainer and the simulator.

Parameters are taken in reverse registration order, the order backward produces their gradients,
and a bucket is closed as soon as it holds at least `cap_bytes` (PyTorch DDP's rule). "At least"
rather than "at most" matters for overlap: a large gradient that is ready early (LeNet's fc1, 1.6 MB)
closes the bucket it lands in and is sent at once, instead of opening a new bucket that must wait
for the last, earliest layers. The first bucket's cap is small (`first_cap_bytes`), as in DDP, so
the first all-reduce starts as early as possible in backward.
"""
from __future__ import annotations

DEFAULT_CAP_MB = 25.0
DEFAULT_FIRST_CAP_MB = 1.0


def assign_buckets(sizes_bytes: list[int], cap_bytes: int, first_cap_bytes: int | None = None,
                   keys: list | None = None) -> list[list[int]]:
    """Group parameter indices (given in registration order) into buckets, in backward order.

    `keys` (e.g. dtype/device per parameter) may not mix within a bucket. Returns lists of indices
    into `sizes_bytes`; bucket 0 is the one whose gradients are ready first.
    """
    if cap_bytes <= 0:
        raise ValueError("bucket cap must be positive")
    first = cap_bytes if first_cap_bytes is None else min(first_cap_bytes, cap_bytes)
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in reversed(range(len(sizes_bytes))):
        if current and keys is not None and keys[i] != keys[current[0]]:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += sizes_bytes[i]
        if filled >= (first if not buckets else cap_bytes):
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets
