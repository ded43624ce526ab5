"""PyTorch DistributedDataParallel (gloo, CPU) on asgd's problem: the peer a user would pick instead.

    mpiexec -n N python bench/peers/ddp_peer.py [--epochs 5] [--out DIR] [--stop-at 0.95]

As asgd's allreduce at N ranks: the same data (asgd.data.problem.default_problem(), each
rank its allreduce share, the same per-epoch shuffles), model (2-H-2, sigmoid, softmax
cross-entropy, float64, asgd.net.mlp.init_params), batch B per rank, and asgd's optimizer
(--optimizer, default asgd's) at allreduce's default lr (asgd.net.optimizers.default_lr(O,
H, N)) as the torch.optim class with the same update (torch_mlp.torch_optimizer). One
thread per rank; rank and size from the launcher's environment (or mpi4py); the process
group meets through a file in --out. Rank 0 evaluates held-out accuracy each epoch and
writes <out>/results.json in asgd's schema (the keys bench/ reads: config, wall_s since
process start, init_s, train_s, metrics.history, metrics.accuracy, throughput.samples_per_s
and updates_per_s, an update being one synchronous step of all ranks).
"""

import time

T0 = time.perf_counter()   # wall is measured from process start: imports count, as in asgd.train

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import mpi4py

mpi4py.rc.initialize = mpi4py.rc.finalize = False   # asgd's modules import mpi4py.MPI; gloo talks, not MPI

from torch_mlp import torch_mlp, torch_optimizer


def rank_and_size() -> tuple[int, int]:
    env = os.environ
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in env and s in env:
            return int(env[r]), int(env[s])
    from mpi4py import MPI   # no launcher variables: ask MPI
    if not MPI.Is_initialized():
        MPI.Init()
    return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=10000, help="hidden units (default 10000)")
    p.add_argument("--batch", type=int, default=256, help="mini-batch per rank (default 256)")
    p.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adagrad", "adam"), default=None,
                   help="default: asgd's (asgd.run.config.Config.optimizer)")
    p.add_argument("--lr", type=float, default=None,
                   help="default: asgd.net.optimizers.default_lr(optimizer, hidden, N), asgd allreduce's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at", type=float, default=None,
                   help="stop after the first epoch whose held-out accuracy reaches this")
    p.add_argument("--out", type=Path, default=Path("runs/ddp"), help="run folder (default runs/ddp)")
    p.add_argument("--timeout", type=float, default=300, help="gloo's collective timeout, seconds (default 300)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, size = rank_and_size()
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from asgd.net import mlp, optimizers
    from asgd.run.config import Config
    from asgd.data import problem
    from asgd.data.shares import assign
    from asgd.core.schedule import Schedule
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rendezvous = args.out / ".ddp-rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous.resolve()}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=args.timeout))

    train, test = problem.default_problem(args.seed)
    mine = np.flatnonzero(assign(len(train), args.seed, 0, size, holdout=False) == rank)   # = asgd allreduce's share
    X, y = torch.from_numpy(train.X[mine]), torch.from_numpy(train.y[mine])
    Xt, yt = torch.from_numpy(test.X), torch.from_numpy(test.y)

    layout = mlp.Layout(train.features, args.hidden, train.classes)
    model = torch_mlp(layout, mlp.init_params(layout, args.seed))
    ddp = DDP(model)
    optimizer = args.optimizer or Config().optimizer
    lr = args.lr or optimizers.default_lr(optimizer, args.hidden, size)
    opt = torch_optimizer(optimizer, ddp.parameters(), lr)
    loss_fn = nn.CrossEntropyLoss()
    steps = -(-(-(-len(train) // size)) // args.batch)   # per epoch, of the largest share: every rank the same

    def evaluate():
        with torch.no_grad():
            loss = correct = 0.0
            for i in range(0, len(yt), 512):
                z = model(Xt[i:i + 512])
                loss += nn.functional.cross_entropy(z, yt[i:i + 512], reduction="sum").item()
                correct += (z.argmax(1) == yt[i:i + 512]).sum().item()
        return loss / len(yt), correct / len(yt)

    dist.barrier()
    init_s = time.perf_counter() - T0
    t_train = time.perf_counter()
    history, samples, local_samples, updates = [], 0, 0, 0
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
            local_samples += len(idx)
            updates += 1   # one synchronous update of w per step, all ranks together
        dist.all_reduce(loss_sum)   # epoch's samples and summed batch losses, all ranks
        samples += int(loss_sum[1])
        stop = torch.zeros(1)
        if rank == 0:
            test_loss, test_acc = evaluate()
            now = time.perf_counter()
            history.append({"epoch": epoch + 1, "samples": samples, "time_s": round(now - t_train, 4),
                            "wall_s": round(now - T0, 4), "train_loss": float(loss_sum[0] / loss_sum[1]),
                            "test_loss": test_loss, "test_accuracy": test_acc})
            print(f"epoch {epoch + 1}/{args.epochs}  held-out acc {test_acc:.4f}  wall {now - T0:.2f} s", flush=True)
            stop[0] = args.stop_at is not None and test_acc >= args.stop_at
        dist.broadcast(stop, 0)
        if stop[0]:
            break
    dist.barrier()
    wall = time.perf_counter() - T0
    if rank == 0:
        train_s = wall - init_s
        res = {"schema": 1, "peer": "pytorch-ddp-gloo",
               "config": {"world_size": size, "workers": size, "hidden": args.hidden, "batch": args.batch,
                          "epochs": args.epochs, "epochs_run": len(history), "optimizer": optimizer, "lr": lr,
                          "seed": args.seed,
                          "n_w": layout.n_w, "train_points": len(train), "test_points": len(test),
                          "torch": torch.__version__, "backend": "gloo", "threads": torch.get_num_threads(),
                          "python": platform.python_version(), "numpy": np.__version__},
               "wall_s": wall, "init_s": init_s, "train_s": train_s,
               "metrics": {"loss": history[-1]["test_loss"], "accuracy": history[-1]["test_accuracy"],
                           "history": history},
               "throughput": {"samples": samples, "samples_per_s": samples / train_s,
                              "updates": updates, "updates_per_s": updates / train_s}}
        from asgd.run.files import atomic_write
        atomic_write(str(args.out / "results.json"), lambda f: json.dump(res, f, indent=1))
        print(f"results: {args.out / 'results.json'}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        rendezvous.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
