"""RingDataParallel over real gloo processes: equivalence with one worker, overlap, no_sync, errors."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ringsgd
from ringsgd import RingDataParallel
from ringsgd.errors import UsageError

ALGOS = ("ring", "ps", "native")
GLOBAL_BATCH = 24


class Net(nn.Module):
    """Small CNN with several parameter tensors, so tiny buckets give several all-reduces."""

    def __init__(self, unused_branch: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc1 = nn.Linear(4 * 6 * 6, 16)
        self.fc2 = nn.Linear(16, 10)
        self.extra = nn.Linear(16, 10) if unused_branch else None

    def forward(self, x, use_extra=False):
        h = F.relu(self.fc1(F.relu(self.conv(x)).flatten(1)))
        out = self.fc2(h)
        return out + self.extra(h) if use_extra else out


def batches(steps):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (GLOBAL_BATCH,), generator=g))
            for _ in range(steps)]


def shard(t, rank, n):
    b = len(t) // n
    return t[rank * b:(rank + 1) * b]


def flat(ts):
    return torch.cat([t.detach().reshape(-1) for t in ts])


def run_training(algo, overlap, steps=4, seed_by_rank=True):
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank if seed_by_rank else 0)  # replicas start different: construction must fix that
    model = RingDataParallel(Net(), algo=algo, overlap=overlap, bucket_cap_mb=0.002, first_bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    grads = []
    for x, y in batches(steps):
        opt.zero_grad()
        F.cross_entropy(model(shard(x, rank, n)), shard(y, rank, n)).backward()
        grads.append(flat(p.grad for p in model.parameters()))
        opt.step()
    return {"params": flat(model.parameters()), "grads": grads, "events": model.last_pass_events,
            "buckets": len(model.buckets)}


def accumulation(algo):
    """Two micro-batches per step, the first under no_sync: same as one worker on both."""
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = RingDataParallel(Net(), algo=algo, bucket_cap_mb=0.002)
    (x1, y1), (x2, y2) = batches(2)
    model.zero_grad()
    with model.no_sync():
        (F.cross_entropy(model(shard(x1, rank, n)), shard(y1, rank, n)) / 2).backward()
    local_after_no_sync = flat(p.grad for p in model.parameters())
    (F.cross_entropy(model(shard(x2, rank, n)), shard(y2, rank, n)) / 2).backward()
    return {"grads": flat(p.grad for p in model.parameters()), "local": local_after_no_sync}


def unused(algo):
    """rank 0 uses the extra head, the others do not: every rank must end with the same average."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = RingDataParallel(Net(unused_branch=True), algo=algo, bucket_cap_mb=0.002)
    x, y = batches(1)[0]
    F.cross_entropy(model(x[:4], use_extra=(rank == 0)), y[:4]).backward()
    return flat(p.grad for p in model.parameters())


def _worker():
    out = {(a, o): run_training(a, o) for a in ALGOS for o in (True, False)}
    out["accumulate"] = {a: accumulation(a) for a in ALGOS}
    out["unused"] = {a: unused(a) for a in ALGOS}
    return out


@pytest.fixture(scope="module")
def runs():
    return {n: ringsgd.launch(_worker, workers=n, timeout=60) for n in (1, 2, 3)}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("overlap", [True, False])
def test_replicas_stay_bit_identical(runs, n, algo, overlap):
    ranks = runs[n]
    for r in ranks[1:]:
        assert torch.equal(r[(algo, overlap)]["params"], ranks[0][(algo, overlap)]["params"])


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("overlap", [True, False])
def test_n_workers_equal_one_worker_with_the_same_global_batch(runs, n, algo, overlap):
    one = runs[1][0][(algo, overlap)]["params"]
    many = runs[n][0][(algo, overlap)]["params"]
    torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ALGOS)
def test_overlap_and_no_overlap_give_the_same_gradients(runs, algo):
    for r in runs[2]:
        for g1, g2 in zip(r[(algo, True)]["grads"], r[(algo, False)]["grads"]):
            assert torch.equal(g1, g2)


@pytest.mark.parametrize("algo", ALGOS)
def test_overlap_starts_all_reduce_before_backward_ends(runs, algo):
    ev = runs[2][0][(algo, True)]["events"]
    assert runs[2][0][(algo, True)]["buckets"] >= 3
    kinds = [k for k, _ in ev]
    first_launch = kinds.index("launch")
    last_ready = len(kinds) - 1 - kinds[::-1].index("ready")
    assert first_launch < last_ready, ev  # a bucket went out while gradients were still being made
    assert kinds.index("backward_end") > first_launch
    # without overlap, nothing is launched until backward has finished
    ev_off = [k for k, _ in runs[2][0][(algo, False)]["events"]]
    assert ev_off.index("launch") > ev_off.index("backward_end")


@pytest.mark.parametrize("algo", ALGOS)
def test_no_sync_accumulates_then_reduces(runs, algo):
    one = runs[1][0]["accumulate"][algo]["grads"]
    for r in runs[2]:
        torch.testing.assert_close(r["accumulate"][algo]["grads"], one, rtol=1e-5, atol=1e-7)
    # inside no_sync the gradients stayed local: the two ranks saw different data
    assert not torch.allclose(runs[2][0]["accumulate"][algo]["local"], runs[2][1]["accumulate"][algo]["local"])


@pytest.mark.parametrize("algo", ALGOS)
def test_locally_unused_parameters_are_averaged_too(runs, algo):
    ranks = runs[2]
    assert torch.equal(ranks[0]["unused"][algo], ranks[1]["unused"][algo])
    assert ranks[0]["unused"][algo].abs().sum() > 0


def _mismatch_worker():
    hidden = 16 if dist.get_rank() == 0 else 17
    RingDataParallel(nn.Sequential(nn.Linear(4, hidden), nn.Linear(hidden, 2)))


def test_different_models_on_ranks_is_one_clear_error():
    with pytest.raises(UsageError, match="differs from rank 0's"):
        ringsgd.launch(_mismatch_worker, workers=2, timeout=30)
