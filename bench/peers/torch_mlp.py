"""asgd's MLP and optimizers as PyTorch spells them: the model with asgd's weights, the
torch.optim class that makes asgd's update, and the worker's step as a typical PyTorch user
writes it and by hand on preallocated tensors (bench_kernel); and what the two PyTorch peers
(ddp_peer, rpc_peer) share: their rank, command line, held-out evaluation, per-epoch history
and results.json in asgd's schema (the keys bench/ reads)."""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")   # a peer: one thread per process, like one MPI rank; before numpy

import numpy as np


def torch_mlp(layout, w):
    """torch's d_in-H-d_out MLP (sigmoid hidden layer) with asgd's weights w, in w's dtype
    (float32 or float64)."""
    import torch
    from torch import nn
    W1, b1, W2, b2 = layout.views(w)
    model = nn.Sequential(nn.Linear(layout.d_in, layout.d_hidden), nn.Sigmoid(),
                          nn.Linear(layout.d_hidden, layout.d_out)).to(getattr(torch, w.dtype.name))
    with torch.no_grad():
        for p, v in zip(model.parameters(), (W1.T, b1, W2.T, b2)):
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return model


def torch_optimizer(name: str, params, lr: float):
    """The torch.optim optimizer that makes asgd.net.optimizers' update `name` (same
    hyper-parameters; torch's momentum keeps v/lr where asgd keeps v, the same steps)."""
    from torch import optim
    from asgd.net.optimizers import BETAS, EPS, MOMENTUM, OPTIMIZERS
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    return {"sgd": lambda: optim.SGD(params, lr=lr), "momentum": lambda: optim.SGD(params, lr=lr, momentum=MOMENTUM),
            "adagrad": lambda: optim.Adagrad(params, lr=lr, eps=EPS),   # torch's default eps is 1e-10
            "adam": lambda: optim.Adam(params, lr=lr, betas=BETAS, eps=EPS)}[name]()


def torch_steps(layout, w, X, y, lr):
    """(typical user's step, hand-written step): both apply w -= lr*grad to their own copy of
    w, in w's dtype (X's must match)."""
    import torch
    from torch import nn
    torch.set_num_threads(1)
    W1, b1, W2, b2 = layout.views(w)
    model = torch_mlp(layout, w)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)

    def typical():
        opt.zero_grad()
        loss = loss_fn(model(Xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    B = len(y)
    tW1, tb1, tW2, tb2 = (torch.from_numpy(v.copy()) for v in (W1, b1, W2, b2))
    dt = tW1.dtype
    h, dh = torch.empty(B, layout.d_hidden, dtype=dt), torch.empty(B, layout.d_hidden, dtype=dt)
    z = torch.empty(B, layout.d_out, dtype=dt)
    gW1, gW2 = torch.empty_like(tW1), torch.empty_like(tW2)
    rows = torch.arange(B)

    def manual():
        torch.addmm(tb1, Xt, tW1, out=h)
        h.sigmoid_()
        torch.addmm(tb2, h, tW2, out=z)
        logp = torch.log_softmax(z, dim=1)
        loss = -logp[rows, yt].mean()
        dz = logp.exp_()
        dz[rows, yt] -= 1.0
        dz.mul_(1.0 / B)
        torch.mm(h.T, dz, out=gW2)
        torch.mm(dz, tW2.T, out=dh)
        dh.mul_(h)
        dh.addcmul_(dh, h, value=-1.0)   # dh * h * (1 - h)
        torch.mm(Xt.T, dh, out=gW1)
        tW2.add_(gW2, alpha=-lr)
        tb2.add_(dz.sum(0), alpha=-lr)
        tW1.add_(gW1, alpha=-lr)
        tb1.add_(dh.sum(0), alpha=-lr)
        return loss.item()

    def delta_typical():   # Delta-w of one step, flat, in asgd's layout (for the equivalence check)
        typical()   # -lr * grad is what optim.SGD subtracted; w after - w before would add w's rounding
        d = [(-lr * p.grad).numpy() for p in model.parameters()]   # (float32: eps |w|, far above Delta-w's)
        return np.concatenate([d[0].T.ravel(), d[1], d[2].T.ravel(), d[3]])
    return typical, manual, delta_typical


# -- the PyTorch peers' shared part ----------------------------------------------------------

def as_peer() -> None:
    """In a peer's process: asgd importable from this checkout, and its imports never
    initializing MPI (gloo or TensorPipe talk, not MPI); one thread, as one MPI rank."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    import torch
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the job's size, from the launcher's environment (or mpi4py)."""
    env = os.environ
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in env and s in env:
            return int(env[r]), int(env[s])
    from mpi4py import MPI   # no launcher variables: ask MPI
    if not MPI.Is_initialized():
        MPI.Init()
    return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def peer_parser(doc: str, name: str, *, per: str, epochs: int, lr_default: str, timeout: str):
    """A peer's options; per: whose mini-batch; lr_default: which asgd default_lr it takes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=10000, help="hidden units (default 10000)")
    p.add_argument("--batch", type=int, default=256, help=f"mini-batch per {per} (default 256)")
    p.add_argument("--epochs", type=int, default=epochs, help=f"epochs (default {epochs})")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adagrad", "adam"), default=None,
                   help="default: asgd's (asgd.run.config.Config.optimizer)")
    p.add_argument("--lr", type=float, default=None, help=f"default: asgd.net.optimizers.default_lr{lr_default}")
    p.add_argument("--precision", choices=("float32", "float64"), default="float32",
                   help="the dtype of w, the data and torch's arithmetic (default float32: asgd's and torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at", type=float, default=None,
                   help="stop after the first epoch whose held-out accuracy reaches this")
    p.add_argument("--out", type=Path, default=Path(f"runs/{name}"), help=f"run folder (default runs/{name})")
    p.add_argument("--timeout", type=float, default=300, help=f"{timeout}, seconds (default 300)")
    return p


def optimizer_and_lr(args, workers: int) -> tuple[str, float]:
    """--optimizer (default asgd's) and --lr (default asgd's for that many synchronous workers)."""
    from asgd.net import optimizers
    from asgd.run.config import Config
    optimizer = args.optimizer or Config().optimizer
    return optimizer, args.lr or optimizers.default_lr(optimizer, args.hidden, workers)


def evaluate(model, X, y) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of model on held-out tensors, 512 points at a time."""
    import torch
    from torch import nn
    with torch.no_grad():
        loss = correct = 0.0
        for i in range(0, len(y), 512):
            z = model(X[i:i + 512])
            loss += nn.functional.cross_entropy(z, y[i:i + 512], reduction="sum").item()
            correct += (z.argmax(1) == y[i:i + 512]).sum().item()
    return loss / len(y), correct / len(y)


def epoch_entry(epoch: int, epochs: int, samples: int, t0: float, t_train: float, train_loss: float,
                test: tuple[float, float]) -> dict:
    """An epoch of results.json's metrics.history (wall_s: since t0, the process start), printed."""
    now = time.perf_counter()
    print(f"epoch {epoch}/{epochs}  held-out acc {test[1]:.4f}  wall {now - t0:.2f} s", flush=True)
    return {"epoch": epoch, "samples": samples, "time_s": round(now - t_train, 4), "wall_s": round(now - t0, 4),
            "train_loss": train_loss, "test_loss": test[0], "test_accuracy": test[1]}


def write_results(args, peer: str, ranks: dict, backend: str, run: dict, history: list, samples: int,
                  updates: int) -> None:
    """<out>/results.json: ranks (world_size, workers...) and run's (n_w, lr, points...) into
    config; wall_s, init_s and train_s from run; the metrics of the last epoch; the throughput
    over train_s (an update: one step of w)."""
    import torch
    from asgd.run.files import atomic_write
    wall, init_s = run.pop("wall_s"), run.pop("init_s")
    train_s = wall - init_s
    last = history[-1] if history else {}
    res = {"schema": 1, "peer": peer,
           "config": {**ranks, "hidden": args.hidden, "batch": args.batch, "epochs": args.epochs,
                      "epochs_run": len(history), "seed": args.seed, "precision": args.precision, **run,
                      "torch": torch.__version__, "backend": backend, "threads": torch.get_num_threads(),
                      "python": platform.python_version(), "numpy": np.__version__},
           "wall_s": wall, "init_s": init_s, "train_s": train_s,
           "metrics": {"loss": last.get("test_loss"), "accuracy": last.get("test_accuracy"), "history": history},
           "throughput": {"samples": samples, "samples_per_s": samples / train_s,
                          "updates": updates, "updates_per_s": updates / train_s}}
    atomic_write(str(args.out / "results.json"), lambda f: json.dump(res, f, indent=1))
    print(f"results: {args.out / 'results.json'}", flush=True)
