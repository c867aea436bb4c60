"""One rank of the DDP test in tests/test_multi_gpu.py; run by
``torchrun --standalone --nproc_per_node 2 tests/ddp_worker.py --out DIR [--deterministic]``.

A small model with two of our attention blocks trains a few SGD steps under
DistributedDataParallel, each rank on its share of a global batch. At every step, on its own
GPU, each rank also runs the whole global batch through two single-process copies of the
model at the DDP model's current weights: one in the precision under test, one in float64.
DDP's gradients (all-reduced, averaged) are then the single process's gradients of the mean
loss over the global batch, up to rounding; the float64 copy measures how much rounding each
of the two has.

Rank 0 writes DIR/report.json (the errors, for the test to judge); every rank writes
DIR/rank<r>.pt (its reduced gradients at every step and its final weights, for the
bit-for-bit comparison of two deterministic runs).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from psa_fa2_ext.nn import PSAAttention

STEPS = 3
LOCAL_BATCH = 4
SIDE = 18  # input 18 x 18, 9 x 9 after the stem: N = 81, not a multiple of 8
CLASSES = 10


class Net(nn.Module):
    """Conv stem, two residual attention blocks at YOLO's shapes (128 channels, 2 heads:
    key_dim 32, head_dim 64), pooled linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 128, 3, 2, 1)
        self.attn1 = PSAAttention(128, num_heads=2)
        self.attn2 = PSAAttention(128, num_heads=2)
        self.head = nn.Linear(128, CLASSES)

    def forward(self, x):
        x = F.silu(self.stem(x))
        x = x + self.attn1(x)
        x = x + self.attn2(x)
        return self.head(x.mean((2, 3)))


def global_batch(step: int, world: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(world * LOCAL_BATCH, 3, SIDE, SIDE, generator=gen)
    y = torch.randint(0, CLASSES, (world * LOCAL_BATCH,), generator=gen)
    return x.to(device), y.to(device)


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| in float64: a norm, not a maximum, whose ratio between two
    computations of like rounding is stable from draw to draw."""
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def train(precision: str, rank: int, world: int, device, log: dict) -> dict:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's too)
    model = Net().to(device)
    # BatchNorm in training mode normalises with each rank's own statistics under DDP (as in
    # Ultralytics, which keeps plain BatchNorm), so the global-batch process would differ by
    # more than rounding; with the running statistics every sample's function is the same.
    model.eval()
    single = copy.deepcopy(model)
    single64 = copy.deepcopy(model).double()
    ddp = DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    names = [n for n, _ in model.named_parameters()]
    steps_grads = []
    for step in range(STEPS):
        x, y = global_batch(step, world, device)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = F.cross_entropy(ddp(x[mine]), y[mine])
        loss.backward()  # DDP all-reduces and averages the gradients here
        reduced = grads_of(ddp.module)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world

        for m in (single, single64):
            m.load_state_dict(ddp.module.state_dict())
            m.zero_grad(set_to_none=True)
        with autocast:
            loss1 = F.cross_entropy(single(x), y)
        loss1.backward()
        loss64 = F.cross_entropy(single64(x.double()), y)
        loss64.backward()
        if rank == 0:
            log.setdefault(precision, []).append({
                "step": step,
                "loss": {"ddp": rel(mean_loss, loss64.detach()), "single": rel(loss1.detach(), loss64.detach())},
                "grads": {n: {"ddp": rel(g, p64.grad), "single": rel(p1.grad, p64.grad)}
                          for n, g, p1, p64 in zip(names, reduced, single.parameters(),
                                                   single64.parameters())},
            })
        steps_grads.append([g.cpu() for g in reduced])
        opt.step()
    return {"grads": steps_grads, "params": [p.detach().cpu() for p in ddp.module.parameters()]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    # fp32 means fp32: no TF32 in the convolutions (PyTorch's default allows it there), none
    # in matmuls (its default already).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.deterministic:
        torch.use_deterministic_algorithms(True)  # needs CUBLAS_WORKSPACE_CONFIG, set by the test
    log: dict = {"world": world, "deterministic": args.deterministic}
    dumps = {p: train(p, rank, world, device, log) for p in ("fp32", "bf16")}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(dumps, args.out / f"rank{rank}.pt")
    if rank == 0:
        (args.out / "report.json").write_text(json.dumps(log, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
