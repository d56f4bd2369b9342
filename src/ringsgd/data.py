"""Data sets as in-memory tensors, their file formats, and the sampler that shards every global batch.

The sets are small (at most 60k images), so each worker holds all of it as one normalised tensor and
indexes it; no DataLoader, no worker processes. MNIST (IDX) and CIFAR-10 (python pickle batches) are
read from their standard files and every way a file can be wrong is one DataError naming the file.
Nothing is ever downloaded: `digits` ships with scikit-learn, and the writers below produce real-format
files for tests and benchmarks.
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import pickle
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from .errors import DataError, UsageError

DATASETS = ("digits", "mnist", "cifar10")

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR_LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
DIGITS_SEED = 0  # the digits split is fixed: the same 1437/360 images in every run and on every rank

_IDX_UBYTE = 0x08


@dataclasses.dataclass
class Dataset:
    """A whole data set in memory: float32 N x C x H x W images (normalised, square) and int64 labels."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def in_channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[-1]


def load_dataset(name: str, data_dir: str | None = None) -> Dataset:
    """Load `name` (one of DATASETS); mnist and cifar10 read their standard files from `data_dir`."""
    if name not in DATASETS:
        raise UsageError(f"unknown dataset {name!r}: use one of {', '.join(DATASETS)}")
    if name == "digits":
        return load_digits()
    expected = (", ".join(f"{f}[.gz]" for f in MNIST_FILES.values()) if name == "mnist"
                else f"{CIFAR_DIR}/ with {', '.join(CIFAR_TRAIN)} and {CIFAR_TEST}")
    if data_dir is None:
        raise DataError(f"{name} needs a data directory (--data-dir) holding {expected}; "
                        f"nothing is downloaded (use --dataset digits to run without files)")
    if not os.path.isdir(data_dir):
        raise DataError(f"data directory {data_dir} does not exist (it should hold {expected})")
    return load_mnist(data_dir) if name == "mnist" else load_cifar10(data_dir)


# ---------------------------------------------------------------------------------------------- digits

def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as [0, 1] 28x28 float32 images, split 80/20 stratified with a fixed seed."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    d = sk_digits()
    images = torch.from_numpy(d.images.astype(np.float32) / 16.0).unsqueeze(1)  # values are 0..16
    # bilinear upsampling to 28x28, so the MNIST nets (LeNet) take the images unchanged
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False).clamp_(0, 1).numpy()
    labels = d.target.astype(np.int64)
    tr_x, te_x, tr_y, te_y = train_test_split(images, labels, test_size=0.2, stratify=labels,
                                              random_state=DIGITS_SEED)
    return tr_x, tr_y, te_x, te_y


def load_digits() -> Dataset:
    """The digits set (1437 train / 360 test), normalised with the training mean and std."""
    tr_x, tr_y, te_x, te_y = (torch.from_numpy(a) for a in _digits_split())
    mean, std = tr_x.mean(), tr_x.std()
    return Dataset("digits", (tr_x - mean) / std, tr_y, (te_x - mean) / std, te_y, 10)


def make_mnist_from_digits(directory: str, gz: bool = False) -> str:
    """Write the digits set (upscaled to 28x28 uint8) as MNIST IDX files in `directory`; returns it.

    Lets `--dataset mnist` run end to end on real-format files where nothing can be downloaded.
    """
    tr_x, tr_y, te_x, te_y = _digits_split()
    to_u8 = lambda x: np.rint(x[:, 0] * 255).astype(np.uint8)  # noqa: E731
    return write_mnist(directory, to_u8(tr_x), tr_y.astype(np.uint8), to_u8(te_x), te_y.astype(np.uint8), gz=gz)


# ----------------------------------------------------------------------------------------------- mnist

def write_idx(path: str, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when `path` ends with .gz)."""
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise UsageError(f"write_idx writes uint8 arrays only, got {array.dtype}")
    if not 1 <= array.ndim <= 255:
        raise UsageError(f"an IDX array needs 1 to 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, _IDX_UBYTE, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(array).tobytes()
    if path.endswith(".gz"):
        with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime=0: same data, same bytes
            f.write(payload)
    else:
        with open(path, "wb") as f:
            f.write(payload)


def read_idx(path: str, ndim: int) -> np.ndarray:
    """Read a uint8 IDX file of `ndim` dimensions; any defect is a DataError naming `path`."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from None
    want = (_IDX_UBYTE << 8) | ndim
    what = "images" if ndim == 3 else "labels" if ndim == 1 else f"{ndim}-d data"
    if len(raw) < 4:
        raise DataError(f"{path}: truncated IDX file: {len(raw)} bytes, not even the 4-byte magic number")
    magic = int.from_bytes(raw[:4], "big")
    if magic != want:
        raise DataError(f"{path}: not an IDX {what} file: magic number is 0x{magic:08x}, expected 0x{want:08x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX file: expected a {header}-byte header, found {len(raw)} bytes")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        kind = "truncated" if len(raw) < expected else "oversized"
        raise DataError(f"{path}: {kind} IDX file: dimensions {'x'.join(map(str, dims))} need "
                        f"{expected} bytes, found {len(raw)} bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def write_mnist(directory: str, train_images: np.ndarray, train_labels: np.ndarray, test_images: np.ndarray,
                test_labels: np.ndarray, gz: bool = False) -> str:
    """Write the four MNIST IDX files (N x H x W uint8 images, N uint8 labels) into `directory`; returns it."""
    os.makedirs(directory, exist_ok=True)
    arrays = {"train_images": train_images, "train_labels": train_labels,
              "test_images": test_images, "test_labels": test_labels}
    for key, name in MNIST_FILES.items():
        write_idx(os.path.join(directory, name + (".gz" if gz else "")), arrays[key])
    return directory


def _find_mnist_file(directory: str, name: str) -> str:
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    raise DataError(f"MNIST file missing in {directory}: looked for {name} and {name}.gz")


def _check_labels(path: str, labels: np.ndarray, num_classes: int) -> None:
    if labels.size and int(labels.max()) >= num_classes:
        raise DataError(f"{path}: label {int(labels.max())} is out of range: labels must be 0..{num_classes - 1}")


def _mnist_split(directory: str, images_name: str, labels_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    images_path = _find_mnist_file(directory, images_name)
    labels_path = _find_mnist_file(directory, labels_name)
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise DataError(f"{labels_path} has {len(labels)} labels but {images_path} has {len(images)} images")
    if images.shape[1] != images.shape[2]:
        raise DataError(f"{images_path}: images must be square, got {images.shape[1]}x{images.shape[2]}")
    _check_labels(labels_path, labels, 10)
    x = (torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1) - MNIST_MEAN) / MNIST_STD
    return x, torch.from_numpy(labels.astype(np.int64))


def load_mnist(directory: str) -> Dataset:
    """MNIST from the four standard IDX files (plain or .gz), normalised with the usual mean/std."""
    tr_x, tr_y = _mnist_split(directory, MNIST_FILES["train_images"], MNIST_FILES["train_labels"])
    te_x, te_y = _mnist_split(directory, MNIST_FILES["test_images"], MNIST_FILES["test_labels"])
    return Dataset("mnist", tr_x, tr_y, te_x, te_y, 10)


# --------------------------------------------------------------------------------------------- cifar10

class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR batch holds (dicts, lists, bytes, numpy arrays): a pickle can run any
    code it names, and a data directory should never be able to do that."""

    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
                ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR batch never holds")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):  # numpy 1 pickles under numpy 2
            module = "numpy._core." + module[len("numpy.core."):]
        return super().find_class(module, name)


def _cifar_dir(directory: str) -> str:
    nested = os.path.join(directory, CIFAR_DIR)
    return nested if os.path.isdir(nested) else directory


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    except Exception as e:  # UnpicklingError, EOFError, ValueError, ...: all mean a corrupt file
        raise DataError(f"{path}: not a readable CIFAR-10 python batch ({type(e).__name__}: {e})") from None
    if not isinstance(batch, dict):
        raise DataError(f"{path}: a CIFAR-10 batch is a dict, found {type(batch).__name__}")
    get = lambda key: batch.get(key.encode(), batch.get(key))  # noqa: E731  (py2 files: bytes keys)
    data, labels = get("data"), get("labels")
    if data is None or labels is None:
        raise DataError(f"{path}: a CIFAR-10 batch needs b'data' and b'labels', found keys {sorted(map(str, batch))}")
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: b'data' must be uint8 N x 3072, found {data.dtype} "
                        f"{' x '.join(map(str, data.shape))}")
    try:
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"{path}: b'labels' must be a list of integers") from None
    if len(labels) != len(data):
        raise DataError(f"{path}: {len(labels)} labels for {len(data)} images")
    if labels.size and (labels.min() < 0 or labels.max() >= 10):
        raise DataError(f"{path}: labels must be 0..9, found {labels.min()}..{labels.max()}")
    return data, labels


def _cifar_tensors(data: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return (x - mean) / std, torch.from_numpy(labels)


def load_cifar10(directory: str) -> Dataset:
    """CIFAR-10 from the python batches in `directory`/cifar-10-batches-py/ (or `directory` itself),
    normalised with the standard per-channel mean/std."""
    where = _cifar_dir(directory)
    missing = [n for n in CIFAR_TRAIN + (CIFAR_TEST,) if not os.path.isfile(os.path.join(where, n))]
    if missing:
        raise DataError(f"CIFAR-10 file{'s' if len(missing) > 1 else ''} missing in {where}: {', '.join(missing)} "
                        f"(looked in {os.path.join(directory, CIFAR_DIR)} and {directory})")
    train = [_read_cifar_batch(os.path.join(where, n)) for n in CIFAR_TRAIN]
    tr_x, tr_y = _cifar_tensors(np.concatenate([d for d, _ in train]), np.concatenate([y for _, y in train]))
    te_x, te_y = _cifar_tensors(*_read_cifar_batch(os.path.join(where, CIFAR_TEST)))
    return Dataset("cifar10", tr_x, tr_y, te_x, te_y, 10)


def write_cifar10(directory: str, train_data: np.ndarray, train_labels, test_data: np.ndarray, test_labels) -> str:
    """Write `directory`/cifar-10-batches-py/ as the real set has it: 5 training batches (the training data
    split evenly), test_batch and batches.meta. Data: uint8, N x 3072 or N x 3 x 32 x 32. Returns the folder."""
    where = os.path.join(directory, CIFAR_DIR)
    os.makedirs(where, exist_ok=True)

    def flat(data):
        data = np.asarray(data)
        if data.dtype != np.uint8 or data.size % 3072 or (data.ndim != 2 and data.shape[1:] != (3, 32, 32)):
            raise UsageError(f"CIFAR-10 data must be uint8 N x 3072 or N x 3 x 32 x 32, got {data.dtype} {data.shape}")
        return np.ascontiguousarray(data.reshape(len(data), 3072))

    def dump(name, batch):
        with open(os.path.join(where, name), "wb") as f:
            pickle.dump(batch, f, protocol=2)  # protocol 2, like the original (python 2) files

    train_data, train_labels = flat(train_data), np.asarray(train_labels).reshape(-1)
    parts = np.array_split(np.arange(len(train_data)), len(CIFAR_TRAIN))
    for i, (name, idx) in enumerate(zip(CIFAR_TRAIN, parts), 1):
        dump(name, {b"batch_label": f"training batch {i} of 5".encode(), b"data": train_data[idx],
                    b"labels": [int(v) for v in train_labels[idx]]})
    dump(CIFAR_TEST, {b"batch_label": b"testing batch 1 of 1", b"data": flat(test_data),
                      b"labels": [int(v) for v in np.asarray(test_labels).reshape(-1)]})
    dump("batches.meta", {b"label_names": [n.encode() for n in CIFAR_LABELS], b"num_cases_per_batch": len(parts[0]),
                          b"num_vis": 3072})
    return where


# --------------------------------------------------------------------------------------------- sampler

class ShardedBatchSampler:
    """Yields this rank's indices of every global batch, so N workers together do one worker's step.

    Each epoch is a permutation from `torch.Generator().manual_seed(seed + epoch)` (never the global
    RNG); global batch i is perm[i*B:(i+1)*B], the last incomplete one dropped so every rank takes the
    same number of steps, and rank r takes the contiguous slice [r*B/N, (r+1)*B/N) of it. The N shards
    are disjoint and together exactly the batch a 1-worker run with batch B would use, which is what
    makes N-worker training equal 1-worker training.

    State is (epoch, step): the next batch to yield is batch `step` of `epoch`. Iterating advances
    `step` batch by batch, and finishing an epoch moves on to (epoch + 1, 0), so `state_dict()` taken
    at any point resumes right after the last batch handed out. `set_epoch(e)` starts epoch e from
    batch 0, unless the sampler is already in epoch e (a resumed run keeps its position).
    """

    def __init__(self, num_samples: int, global_batch: int, rank: int, world_size: int, seed: int = 0):
        if world_size < 1:
            raise UsageError(f"world size must be at least 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is out of range for {world_size} workers (0..{world_size - 1})")
        if global_batch < 1:
            raise UsageError(f"global batch must be positive, got {global_batch}")
        if global_batch % world_size:
            lo = global_batch // world_size * world_size
            hint = f"{lo} or {lo + world_size}" if lo else f"{world_size}"
            raise UsageError(f"global batch {global_batch} does not split evenly over {world_size} workers: "
                             f"use a multiple of {world_size}, e.g. {hint}")
        if global_batch > num_samples:
            raise UsageError(f"global batch {global_batch} is larger than the data set ({num_samples} samples)")
        self.num_samples, self.global_batch, self.seed = num_samples, global_batch, seed
        self.rank, self.world_size = rank, world_size
        self.local_batch = global_batch // world_size
        self.epoch, self.start_step = 0, 0

    def __len__(self) -> int:
        """Steps per epoch (the same on every rank)."""
        return self.num_samples // self.global_batch

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise UsageError(f"epoch must be non-negative, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self.start_step = epoch, 0

    def global_batches(self, epoch: int) -> list[torch.Tensor]:
        """All global batches of `epoch` in order: what a 1-worker run with the same batch would see."""
        perm = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
        return list(perm[: len(self) * self.global_batch].view(len(self), self.global_batch))

    def __iter__(self):
        epoch, lo = self.epoch, self.rank * self.local_batch
        batches = self.global_batches(epoch)
        for i in range(self.start_step, len(batches)):
            self.start_step = i + 1  # handed out: a checkpoint taken now resumes with the next one
            yield batches[i][lo: lo + self.local_batch].clone()
        if self.epoch == epoch:
            self.epoch, self.start_step = epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.start_step}

    def load_state_dict(self, state: dict) -> None:
        try:
            epoch, step = int(state["epoch"]), int(state["step"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"sampler state must be {{'epoch': int, 'step': int}}, got {state!r}") from None
        if epoch < 0 or not 0 <= step <= len(self):
            raise UsageError(f"sampler state epoch {epoch}, step {step} is out of range "
                             f"({len(self)} steps per epoch)")
        self.epoch, self.start_step = epoch, step
