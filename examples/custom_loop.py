"""RingDataParallel in a plain training loop: swap it for DistributedDataParallel and back.

    python examples/custom_loop.py            # 2 workers on this machine
    torchrun --nproc-per-node 2 examples/custom_loop.py
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ringsgd
from ringsgd.data import ShardedBatchSampler, load_dataset
from ringsgd.models import build_model


def worker(epochs: int = 3, global_batch: int = 64) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = load_dataset("digits")
    torch.manual_seed(0)
    model = ringsgd.RingDataParallel(build_model("lenet", 1, 10, 28), algo="ring")  # broadcasts rank 0's weights
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = ShardedBatchSampler(len(ds.train_y), global_batch, rank, world)  # this rank's shard of each batch
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for idx in sampler:
            opt.zero_grad()
            F.cross_entropy(model(ds.train_x[idx]), ds.train_y[idx]).backward()  # averaged on return
            opt.step()
    with torch.no_grad():
        accuracy = (model(ds.test_x).argmax(1) == ds.test_y).float().mean().item()
    if rank == 0:
        print(f"{world} workers, {epochs} epochs: test accuracy {100 * accuracy:.1f}%")
    return accuracy


if __name__ == "__main__":  # spawned workers import this file: keep the launch behind the guard
    ringsgd.launch(worker, workers=2)
