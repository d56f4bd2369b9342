"""Atomic, verified checkpoints: a crash never leaves a half-written file where a good one was.

Written to a temporary file in the same directory, fsynced, then renamed over the target (rename is
atomic on POSIX), and the directory fsynced. Each file carries a SHA-256 of its payload, so a
truncated or corrupted checkpoint is refused with a message instead of silently resuming from junk.
The newest `keep` checkpoints are kept, so the previous good one survives a bad new one.
"""
from __future__ import annotations

import glob
import hashlib
import io
import os
import re

import torch

from .errors import CheckpointError

FORMAT = "ringsgd-checkpoint-v1"
_MAGIC = b"RINGSGD1"
_NAME = "ckpt-epoch{:04d}.pt"


def path_for(directory: str, epoch: int) -> str:
    return os.path.join(directory, _NAME.format(epoch))


def save(state: dict, directory: str, epoch: int, keep: int = 2) -> str:
    """Write `state` as the checkpoint after `epoch` (1-based); returns its path."""
    os.makedirs(directory, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    payload = buf.getvalue()
    path = path_for(directory, epoch)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(directory)[:-keep]:
        os.remove(old)
    return path


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint files in `directory`, oldest first."""
    files = glob.glob(os.path.join(directory, "ckpt-epoch*.pt"))
    return sorted(f for f in files if re.fullmatch(r"ckpt-epoch\d{4}\.pt", os.path.basename(f)))


def load(path: str) -> dict:
    """Read and verify one checkpoint; CheckpointError says what is wrong with it."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    head = len(_MAGIC) + 32
    if len(raw) < head or raw[:len(_MAGIC)] != _MAGIC:
        raise CheckpointError(f"{path} is not a ringsgd checkpoint (bad header, {len(raw)} bytes)")
    if hashlib.sha256(raw[head:]).digest() != raw[len(_MAGIC):head]:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt (checksum mismatch); "
                              "delete it to resume from the previous one")
    try:
        state = torch.load(io.BytesIO(raw[head:]), map_location="cpu", weights_only=False)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be unpickled: {e}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} has an unknown checkpoint format")
    return state


def latest(directory: str) -> str | None:
    files = list_checkpoints(directory)
    return files[-1] if files else None
