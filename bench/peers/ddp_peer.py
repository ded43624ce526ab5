"""PyTorch DistributedDataParallel (gloo, CPU) on asgd's problem: the peer a user would pick instead.

    mpiexec -n N python bench/peers/ddp_peer.py [--epochs 5] [--out DIR] [--stop-at 0.95]

As asgd's allreduce at N ranks: the same data, rank shares, per-epoch shuffles, model and
init (asgd.net.mlp.init_params), precision (--precision), batch B per rank, and asgd's optimizer at allreduce's
default lr as the torch.optim class with the same update (torch_mlp.torch_optimizer). Rank 0
evaluates held-out accuracy each epoch and writes <out>/results.json in asgd's schema (the
keys bench/ reads; an update is one synchronous step of all ranks).
"""

import time

T0 = time.perf_counter()   # wall is measured from process start: imports count, as in asgd.train

import sys

from torch_mlp import (as_peer, epoch_entry, evaluate, optimizer_and_lr, peer_parser, rank_and_size, torch_mlp,
                       torch_optimizer, write_results)   # first: it pins one thread per process before numpy

import numpy as np


def main(argv=None) -> int:
    args = peer_parser(__doc__, "ddp", per="rank", epochs=5, timeout="gloo's collective timeout",
                       lr_default="(optimizer, hidden, N), asgd allreduce's").parse_args(argv)
    as_peer()
    rank, size = rank_and_size()
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from asgd.core.schedule import Schedule
    from asgd.data import problem
    from asgd.data.shares import assign
    from asgd.net import mlp
    args.out.mkdir(parents=True, exist_ok=True)
    rendezvous = args.out / ".ddp-rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous.resolve()}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=args.timeout))

    train, test = problem.default_problem(args.seed)
    mine = np.flatnonzero(assign(len(train), args.seed, 0, size, holdout=False) == rank)   # = asgd allreduce's share
    X, y = torch.from_numpy(train.X[mine].astype(args.precision)), torch.from_numpy(train.y[mine])
    Xt, yt = torch.from_numpy(test.X.astype(args.precision)), torch.from_numpy(test.y)

    layout = mlp.Layout(train.features, args.hidden, train.classes)
    model = torch_mlp(layout, mlp.init_params(layout, args.seed, args.precision))
    ddp = DDP(model)
    optimizer, lr = optimizer_and_lr(args, size)
    opt = torch_optimizer(optimizer, ddp.parameters(), lr)
    loss_fn = nn.CrossEntropyLoss()
    steps = -(-(-(-len(train) // size)) // args.batch)   # per epoch, of the largest share: every rank the same

    dist.barrier()
    init_s = time.perf_counter() - T0
    t_train = time.perf_counter()
    history, samples, updates = [], 0, 0
    for epoch in range(args.epochs):
        loss_sum = torch.zeros(2, dtype=torch.float64)
        plan = Schedule(args.batch, args.epochs, (args.seed, rank), 1.0, steps_per_epoch=steps)
        for idx in plan.batches(len(y), epoch):
            idx = torch.from_numpy(idx)   # the same batches as asgd's allreduce on this rank
            opt.zero_grad()
            # an empty last batch (uneven shares) still takes part in the gradient allreduce
            loss = loss_fn(ddp(X[idx]), y[idx]) if len(idx) else (ddp(X[:1]) * 0.0).sum()
            loss.backward()
            opt.step()
            loss_sum += torch.tensor([loss.item() * len(idx), len(idx)])
            updates += 1   # one synchronous update of w per step, all ranks together
        dist.all_reduce(loss_sum)   # epoch's samples and summed batch losses, all ranks
        samples += int(loss_sum[1])
        stop = torch.zeros(1)
        if rank == 0:
            history.append(epoch_entry(epoch + 1, args.epochs, samples, T0, t_train,
                                       float(loss_sum[0] / loss_sum[1]), evaluate(model, Xt, yt)))
            stop[0] = args.stop_at is not None and history[-1]["test_accuracy"] >= args.stop_at
        dist.broadcast(stop, 0)
        if stop[0]:
            break
    dist.barrier()
    if rank == 0:
        write_results(args, "pytorch-ddp-gloo", {"world_size": size, "workers": size}, "gloo",
                      {"wall_s": time.perf_counter() - T0, "init_s": init_s, "optimizer": optimizer, "lr": lr,
                       "n_w": layout.n_w, "train_points": len(train), "test_points": len(test)},
                      history, samples, updates)
    dist.destroy_process_group()
    if rank == 0:
        rendezvous.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
