"""Data sets, their file formats and every defect a file can have, and the sharded batch sampler."""
import gzip
import io
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ringsgd import data
from ringsgd.data import ShardedBatchSampler, load_dataset
from ringsgd.errors import DataError, UsageError

RNG = np.random.default_rng(0)


def mnist_arrays(n_train=12, n_test=5, size=28):
    return (RNG.integers(0, 256, (n_train, size, size), dtype=np.uint8), RNG.integers(0, 10, n_train, dtype=np.uint8),
            RNG.integers(0, 256, (n_test, size, size), dtype=np.uint8), RNG.integers(0, 10, n_test, dtype=np.uint8))


def cifar_arrays(n_train=13, n_test=4):
    return (RNG.integers(0, 256, (n_train, 3072), dtype=np.uint8), RNG.integers(0, 10, n_train).tolist(),
            RNG.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8), RNG.integers(0, 10, n_test))


def open_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def save_bytes(path, raw):
    with open(path, "wb") as f:
        f.write(raw)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


# ---------------------------------------------------------------------------------------------- digits

def test_digits_split_shapes_and_normalisation(digits):
    assert (len(digits.train_y), len(digits.test_y)) == (1437, 360)
    assert digits.train_x.shape == (1437, 1, 28, 28) and digits.train_x.dtype == torch.float32
    assert digits.train_y.dtype == torch.int64 and digits.num_classes == 10
    assert (digits.in_channels, digits.image_size) == (1, 28)
    assert abs(digits.train_x.mean().item()) < 1e-4 and abs(digits.train_x.std().item() - 1) < 1e-4
    # stratified: every class is in the test set in proportion
    counts = torch.bincount(digits.test_y, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38


def test_digits_is_deterministic_whatever_the_global_rng(digits):
    torch.manual_seed(123)
    np.random.seed(123)
    again = load_dataset("digits", data_dir="/ignored")
    assert torch.equal(again.train_x, digits.train_x) and torch.equal(again.test_y, digits.test_y)


# ----------------------------------------------------------------------------------------------- mnist

@pytest.mark.parametrize("gz", [False, True])
def test_mnist_round_trip(tmp_path, gz):
    arrays = mnist_arrays()
    data.write_mnist(str(tmp_path), *arrays, gz=gz)
    suffix = ".gz" if gz else ""
    assert sorted(os.listdir(tmp_path)) == sorted(n + suffix for n in data.MNIST_FILES.values())
    ds = load_dataset("mnist", str(tmp_path))
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.test_x.shape == (5, 1, 28, 28)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    raw = ds.train_x[:, 0] * data.MNIST_STD + data.MNIST_MEAN
    assert torch.allclose(raw * 255, torch.from_numpy(arrays[0]).float(), atol=1e-3)
    assert ds.train_y.tolist() == arrays[1].tolist() and ds.test_y.tolist() == arrays[3].tolist()


def test_idx_header_is_the_standard_one(tmp_path):
    path = str(tmp_path / "x")
    data.write_idx(path, np.zeros((2, 3, 4), np.uint8))
    raw = (tmp_path / "x").read_bytes()
    assert raw[:4] == b"\x00\x00\x08\x03" and raw[4:16] == bytes([0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4])
    assert len(raw) == 16 + 24
    with pytest.raises(UsageError, match="uint8"):
        data.write_idx(path, np.zeros(3, np.float32))


def test_make_mnist_from_digits_loads_as_mnist(tmp_path, digits):
    data.make_mnist_from_digits(str(tmp_path))
    ds = load_dataset("mnist", str(tmp_path))
    assert ds.train_x.shape == digits.train_x.shape and ds.test_x.shape == digits.test_x.shape
    assert torch.equal(ds.train_y, digits.train_y) and torch.equal(ds.test_y, digits.test_y)
    # the same pictures, up to uint8 quantisation: normalised images are almost perfectly correlated
    a, b = ds.train_x.flatten(), digits.train_x.flatten()
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.999


def test_mnist_needs_a_directory(tmp_path):
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_dataset("mnist")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("mnist", str(tmp_path / "nope"))


def test_missing_mnist_file_names_both_candidates(tmp_path):
    data.write_mnist(str(tmp_path), *mnist_arrays())
    os.remove(tmp_path / "t10k-labels-idx1-ubyte")
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte and t10k-labels-idx1-ubyte\.gz"):
        load_dataset("mnist", str(tmp_path))


def test_wrong_magic_says_expected_and_found(tmp_path):
    tr_x, tr_y, te_x, te_y = mnist_arrays()
    data.write_mnist(str(tmp_path), tr_x, tr_y, te_x, te_y)
    data.write_idx(str(tmp_path / "train-images-idx3-ubyte"), tr_y)  # a labels file where images belong
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.*0x00000801.*expected 0x00000803"):
        load_dataset("mnist", str(tmp_path))
    data.write_idx(str(tmp_path / "train-images-idx3-ubyte"), tr_x)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x1f\x8b\x08\x00" + bytes(20))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte.*0x1f8b0800.*expected 0x00000801"):
        load_dataset("mnist", str(tmp_path))


@pytest.mark.parametrize("keep", [2, 10, 16 + 28 * 28 * 12 - 1])
def test_truncated_idx_says_expected_and_actual_bytes(tmp_path, keep):
    data.write_mnist(str(tmp_path), *mnist_arrays())
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(DataError, match=rf"train-images-idx3-ubyte: truncated IDX file.*\b{keep} bytes"):
        load_dataset("mnist", str(tmp_path))


def test_truncated_idx_message_has_both_sizes(tmp_path):
    data.write_mnist(str(tmp_path), *mnist_arrays())
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    full = 16 + 12 * 28 * 28
    with pytest.raises(DataError, match=rf"need {full} bytes, found {full - 100}"):
        load_dataset("mnist", str(tmp_path))


def test_label_count_mismatch_names_both_files(tmp_path):
    tr_x, tr_y, te_x, te_y = mnist_arrays()
    data.write_mnist(str(tmp_path), tr_x, tr_y[:-1], te_x, te_y)
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte has 11 labels but .*train-images-idx3-ubyte "
                                        r"has 12 images"):
        load_dataset("mnist", str(tmp_path))


def test_out_of_range_label_is_refused(tmp_path):
    tr_x, tr_y, te_x, te_y = mnist_arrays()
    tr_y[3] = 12
    data.write_mnist(str(tmp_path), tr_x, tr_y, te_x, te_y)
    with pytest.raises(DataError, match="train-labels-idx1-ubyte: label 12"):
        load_dataset("mnist", str(tmp_path))


@pytest.mark.parametrize("damage", ["garbage", "cut"])
def test_corrupt_gzip_names_the_file(tmp_path, damage):
    data.write_mnist(str(tmp_path), *mnist_arrays(), gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    raw = path.read_bytes()
    path.write_bytes(b"not a gzip file at all" if damage == "garbage" else raw[: len(raw) // 2])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: corrupt or truncated gzip"):
        load_dataset("mnist", str(tmp_path))


def test_plain_file_is_preferred_over_gz(tmp_path):
    arrays = mnist_arrays()
    data.write_mnist(str(tmp_path), *arrays)
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(b"junk")
    assert load_dataset("mnist", str(tmp_path)).train_y.tolist() == arrays[1].tolist()


# --------------------------------------------------------------------------------------------- cifar10

def test_cifar10_round_trip(tmp_path):
    tr_x, tr_y, te_x, te_y = cifar_arrays()
    where = data.write_cifar10(str(tmp_path), tr_x, tr_y, te_x, te_y)
    names = set(os.listdir(where))
    assert set(data.CIFAR_TRAIN) | {"test_batch", "batches.meta"} == names
    sizes = [len(pickle.loads(open_bytes(os.path.join(where, n)), encoding="bytes")[b"labels"])
             for n in data.CIFAR_TRAIN]
    assert sizes == [3, 3, 3, 2, 2]  # 13 split evenly
    ds = load_dataset("cifar10", str(tmp_path))
    assert ds.train_x.shape == (13, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert (ds.in_channels, ds.image_size, ds.num_classes) == (3, 32, 10)
    mean, std = torch.tensor(data.CIFAR_MEAN).view(3, 1, 1), torch.tensor(data.CIFAR_STD).view(3, 1, 1)
    raw = (ds.train_x * std + mean) * 255
    assert torch.allclose(raw, torch.from_numpy(tr_x).float().view(-1, 3, 32, 32), atol=1e-3)
    assert ds.train_y.tolist() == tr_y and ds.test_y.tolist() == te_y.tolist()
    # channel-major layout, as in the real files: the first 1024 bytes are the red plane
    assert torch.allclose(raw[0, 0].flatten(), torch.from_numpy(tr_x[0, :1024]).float(), atol=1e-3)


def test_cifar10_batches_directly_in_data_dir(tmp_path):
    where = data.write_cifar10(str(tmp_path / "x"), *cifar_arrays())
    assert len(load_dataset("cifar10", where).train_y) == 13


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as py2 str opcodes and numpy under numpy.core, like the real CIFAR-10 files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_str8(self, obj):
        self.write(b"U" + bytes([len(obj)]) + obj if len(obj) < 256 else b"T" + len(obj).to_bytes(4, "little") + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_str8


def test_cifar10_reads_python2_numpy1_pickles(tmp_path):
    tr_x, tr_y, te_x, te_y = cifar_arrays(5, 2)
    where = data.write_cifar10(str(tmp_path), tr_x, tr_y, te_x, te_y)
    for name in data.CIFAR_TRAIN:
        path = os.path.join(where, name)
        batch = pickle.loads(open_bytes(path), encoding="bytes")
        buf = io.BytesIO()
        _Py2Pickler(buf, protocol=2).dump(batch)
        raw = buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
        assert b"_codecs" not in raw and b"numpy.core.multiarray" in raw
        save_bytes(path, raw)
    ds = load_dataset("cifar10", str(tmp_path))
    assert ds.train_y.tolist() == tr_y


def _rewrite(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _batch(n=3, width=3072, labels=None):
    return {b"data": np.zeros((n, width), np.uint8), b"labels": list(range(n)) if labels is None else labels}


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.parametrize("name,content,message", [
    ("data_batch_3", b"definitely not a pickle", "not a readable CIFAR-10 python batch"),
    ("data_batch_2", "cut", "not a readable CIFAR-10 python batch"),
    ("test_batch", [1, 2, 3], "is a dict, found list"),
    ("data_batch_1", {b"labels": [1]}, "needs b'data' and b'labels'"),
    ("data_batch_5", _batch(width=1000), r"must be uint8 N x 3072, found uint8 3 x 1000"),
    ("data_batch_4", _batch(labels=[0, 1]), "2 labels for 3 images"),
    ("test_batch", _batch(labels=[0, 1, 10]), r"labels must be 0\.\.9"),
    ("data_batch_1", {b"data": _Evil(), b"labels": []}, r"refers to (__builtin__|builtins)\.print"),
])
def test_bad_cifar_files_name_the_file(tmp_path, capsys, name, content, message):
    where = data.write_cifar10(str(tmp_path), *cifar_arrays())
    path = os.path.join(where, name)
    if isinstance(content, bytes):
        save_bytes(path, content)
    elif content == "cut":
        raw = open_bytes(path)
        save_bytes(path, raw[: len(raw) // 2])
    else:
        _rewrite(path, content)
    with pytest.raises(DataError, match=rf"{name}: .*{message}"):
        load_dataset("cifar10", str(tmp_path))
    assert "must never run" not in capsys.readouterr().out


def test_missing_cifar_files_are_listed(tmp_path):
    where = data.write_cifar10(str(tmp_path), *cifar_arrays())
    os.remove(os.path.join(where, "data_batch_4"))
    os.remove(os.path.join(where, "test_batch"))
    with pytest.raises(DataError, match="missing in .*: data_batch_4, test_batch"):
        load_dataset("cifar10", str(tmp_path))
    with pytest.raises(DataError, match="needs a data directory"):
        load_dataset("cifar10")


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(UsageError, match="digits, mnist, cifar10") as e:
        load_dataset("imagenet")
    assert not isinstance(e.value, DataError)


# --------------------------------------------------------------------------------------------- sampler

def shards(n, batch, world, seed=0, epoch=0):
    """Per step, the list of every rank's shard."""
    samplers = [ShardedBatchSampler(n, batch, r, world, seed=seed) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return list(zip(*[list(s) for s in samplers]))


@settings(max_examples=40, deadline=None)
@given(world=st.integers(1, 5), local=st.integers(1, 6), extra=st.integers(0, 30), seed=st.integers(0, 99),
       epoch=st.integers(0, 5))
def test_shards_are_disjoint_and_make_the_one_worker_batch(world, local, extra, seed, epoch):
    batch = world * local
    n = batch + extra
    one = ShardedBatchSampler(n, batch, 0, 1, seed=seed)
    one.set_epoch(epoch)
    single = list(one)
    steps = shards(n, batch, world, seed, epoch)
    assert len(steps) == len(single) == n // batch
    for parts, whole in zip(steps, single):
        assert all(len(p) == local and p.dtype == torch.int64 for p in parts)
        joined = torch.cat(parts)
        assert len(set(joined.tolist())) == batch  # disjoint
        assert torch.equal(joined, whole)  # rank order concatenated = exactly the 1-worker batch


def test_an_epoch_uses_distinct_samples_and_drops_the_last_partial_batch():
    sampler = ShardedBatchSampler(50, 12, 0, 1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = torch.cat(list(sampler)).tolist()
        assert len(seen) == 48 and len(set(seen)) == 48 and all(0 <= i < 50 for i in seen)
    assert len(sampler) == 4


def test_order_depends_only_on_seed_and_epoch():
    torch.manual_seed(0)
    a = shards(40, 8, 2, seed=3, epoch=1)
    torch.manual_seed(99)
    b = shards(40, 8, 2, seed=3, epoch=1)
    assert all(torch.equal(x, y) for s, t in zip(a, b) for x, y in zip(s, t))
    other_epoch, other_seed = shards(40, 8, 2, seed=3, epoch=2), shards(40, 8, 2, seed=4, epoch=1)
    assert not torch.equal(a[0][0], other_epoch[0][0]) and not torch.equal(a[0][0], other_seed[0][0])
    # the permutation of epoch e is the one from manual_seed(seed + e)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(3 + 1))
    assert torch.equal(a[0][0], perm[:4]) and torch.equal(a[0][1], perm[4:8])


def test_resume_from_state_dict_gives_the_remaining_batches():
    full = ShardedBatchSampler(70, 10, 1, 2, seed=5)
    full.set_epoch(2)
    expected = list(full)
    run = ShardedBatchSampler(70, 10, 1, 2, seed=5)
    run.set_epoch(2)
    it = iter(run)
    taken = [next(it) for _ in range(3)]
    state = run.state_dict()
    assert state == {"epoch": 2, "step": 3}
    resumed = ShardedBatchSampler(70, 10, 1, 2, seed=5)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # a training loop calls this on resume too: it keeps the position
    rest = list(resumed)
    assert len(rest) == 4 and all(torch.equal(a, b) for a, b in zip(taken + rest, expected))
    # a finished epoch moves on, and the loop's next set_epoch agrees
    assert resumed.state_dict() == {"epoch": 3, "step": 0}
    resumed.set_epoch(3)
    assert resumed.state_dict() == {"epoch": 3, "step": 0}
    full.set_epoch(2)  # going back to an epoch starts it over
    assert len(list(full)) == 7


def test_sampler_refuses_bad_arguments():
    with pytest.raises(UsageError, match=r"does not split evenly over 4 workers.*e\.g\. 8 or 12"):
        ShardedBatchSampler(100, 10, 0, 4)
    with pytest.raises(UsageError, match="e.g. 4"):
        ShardedBatchSampler(100, 3, 0, 4)
    with pytest.raises(UsageError, match="larger than the data set"):
        ShardedBatchSampler(10, 12, 0, 2)
    with pytest.raises(UsageError, match="world size"):
        ShardedBatchSampler(10, 4, 0, 0)
    for rank in (-1, 2):
        with pytest.raises(UsageError, match=f"rank {rank} is out of range"):
            ShardedBatchSampler(10, 4, rank, 2)
    with pytest.raises(UsageError, match="positive"):
        ShardedBatchSampler(10, 0, 0, 1)
    s = ShardedBatchSampler(10, 4, 0, 2)
    with pytest.raises(UsageError):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(UsageError, match="out of range"):
        s.load_state_dict({"epoch": 0, "step": 9})
