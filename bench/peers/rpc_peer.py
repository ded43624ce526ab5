"""A PyTorch RPC parameter server (torch.distributed.rpc, CPU) on asgd's problem: what a user
wanting an asynchronous parameter server in Python would pick instead of asgd.

    mpiexec -n N python bench/peers/rpc_peer.py [--epochs 4] [--out DIR] [--stop-at 0.95]

As PyTorch's tutorial "Implementing a Parameter Server Using Distributed RPC Framework"
builds it: rank 0 holds the model and optimizer; each of the N-1 trainers rpc_asyncs its
batch's gradient, the server steps under a lock and returns the parameters, which the
trainer loads before its next step (no overlap); asgd's shares, init, precision, batches,
optimizer and async default lr. Rank 0 evaluates each epoch's worth of pushes and writes
<out>/results.json (ddp_peer.py's keys).
"""

import time

T0 = time.perf_counter()   # wall is measured from process start: imports count, as in asgd.train

import sys
import threading

from torch_mlp import (as_peer, epoch_entry, evaluate, optimizer_and_lr, peer_parser, rank_and_size,
                       torch_mlp as model_of, torch_optimizer, write_results)   # pins one thread per process

SERVER = "ps"
PS = None   # rank 0's ParameterServer: the RPC handlers run in the server's process and find it here


class ParameterServer:
    """The model and its optimizer, stepped under a lock by the RPC threads."""

    def __init__(self, model, optimizer, n_train, trainers, stop_at):
        self.model, self.opt = model, optimizer
        self.lock = threading.Lock()
        self.n_train, self.trainers, self.stop_at = n_train, trainers, stop_at
        self.samples = self.updates = self.done = 0   # done: trainers finished
        self.loss_sum, self.stop = 0.0, False
        self.changed = threading.Condition(self.lock)   # an epoch's worth of samples, or a trainer done

    def push_pull(self, grads, loss_sum, samples):
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad = g
            self.opt.step()
            before = self.samples
            self.samples += samples
            self.updates += 1
            self.loss_sum += loss_sum
            if self.samples // self.n_train > before // self.n_train:
                self.changed.notify_all()
            return [p.detach().clone() for p in self.model.parameters()], self.stop

    def finished(self):
        with self.lock:
            self.done += 1
            self.changed.notify_all()


def push_pull(grads, loss_sum, samples):   # runs on the server
    return PS.push_pull(grads, loss_sum, samples)


def trainer_done():   # runs on the server
    PS.finished()


def parse_args(argv=None):
    p = peer_parser(__doc__, "rpc", per="trainer", epochs=4, timeout="RPC timeout",
                    lr_default="(optimizer, hidden, 1), asgd's async server's")
    p.add_argument("--tcp-only", action="store_true",
                   help="TensorPipe's TCP transport and basic channel only (no shm/cma between processes of "
                        "one machine): for the emulated cluster, whose hosts share a kernel")
    return p.parse_args(argv)


def serve(args, t_train, evaluate):
    """Rank 0's main thread: evaluate at each epoch's worth of samples until every
    trainer is done (or the target is reached); the history in ddp_peer's form."""
    history, epoch = [], 0
    while True:
        with PS.lock:
            PS.changed.wait_for(lambda: PS.samples // PS.n_train > epoch or PS.done == PS.trainers)
            if PS.samples // PS.n_train <= epoch:   # every trainer done, no new epoch
                break
            epoch += 1
            samples, loss_sum = PS.samples, PS.loss_sum
            snapshot = [p.detach().clone() for p in PS.model.parameters()]
        history.append(epoch_entry(epoch, args.epochs, samples, T0, t_train, loss_sum / max(samples, 1),
                                   evaluate(snapshot)))
        if args.stop_at is not None and history[-1]["test_accuracy"] >= args.stop_at:
            with PS.lock:
                PS.stop = True   # the trainers hear it in their next reply
            break
        if epoch >= args.epochs:
            break
    return history


def main(argv=None) -> int:
    global PS
    args = parse_args(argv)
    as_peer()
    rank, size = rank_and_size()
    if size < 2:
        raise SystemExit("rpc_peer.py: needs 2 ranks or more (one server, the others trainers)")
    import torch
    import torch.distributed.rpc as rpc
    from torch import nn

    from asgd.core.schedule import Schedule
    from asgd.data import shares
    from asgd.net import mlp
    args.out.mkdir(parents=True, exist_ok=True)
    rendezvous = args.out / ".rpc-rendezvous"
    if rank == 0:   # a crashed run's marks (the trainers make theirs at their very end)
        for f in args.out.glob(".trainer*.left"):
            f.unlink(missing_ok=True)

    got = shares.embedded(rank, size, shares.Job(1, args.seed))   # asgd's shares: rank 0 the server
    layout = mlp.Layout(got.train.features, args.hidden, got.train.classes)
    model = model_of(layout, mlp.init_params(layout, args.seed, args.precision))
    optimizer, lr = optimizer_and_lr(args, 1)
    if rank == 0:
        PS = ParameterServer(model, torch_optimizer(optimizer, model.parameters(), lr), got.train_points, size - 1,
                             args.stop_at)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{rendezvous.resolve()}", rpc_timeout=args.timeout,
                                           num_worker_threads=max(4, size),
                                           **({"_transports": ["uv"], "_channels": ["basic"]} if args.tcp_only else {}))
    rpc.init_rpc(SERVER if rank == 0 else f"trainer{rank}", rank=rank, world_size=size, rpc_backend_options=opts)
    init_s = time.perf_counter() - T0
    t_train = time.perf_counter()
    if rank == 0:
        Xt, yt = torch.from_numpy(got.test.X.astype(args.precision)), torch.from_numpy(got.test.y)
        judge = model_of(layout, mlp.init_params(layout, args.seed, args.precision))

        def evaluate_params(params):
            with torch.no_grad():
                for p, v in zip(judge.parameters(), params):
                    p.copy_(v)
            return evaluate(judge, Xt, yt)
        history = serve(args, t_train, evaluate_params)
    else:
        X, y = torch.from_numpy(got.train.X.astype(args.precision)), torch.from_numpy(got.train.y)
        plan = Schedule(args.batch, args.epochs, (args.seed, rank - 1), 1.0)   # asgd's worker index: rank - 1
        loss_fn = nn.CrossEntropyLoss()
        for idx in (idx for epoch in range(args.epochs) for idx in plan.batches(len(y), epoch)):
            idx = torch.from_numpy(idx)
            model.zero_grad()
            loss = loss_fn(model(X[idx]), y[idx])
            loss.backward()
            fut = rpc.rpc_async(SERVER, push_pull, args=([p.grad for p in model.parameters()],
                                                         loss.item() * len(idx), len(idx)))
            params, stop = fut.wait()
            with torch.no_grad():
                for p, v in zip(model.parameters(), params):
                    p.copy_(v)
            if stop:
                break
        rpc.rpc_sync(SERVER, trainer_done)
    rpc.shutdown()   # waits for every rank's outstanding work
    if rank == 0:
        write_results(args, "pytorch-rpc-ps", {"world_size": size, "workers": size - 1, "servers": 1}, "tensorpipe",
                      {"wall_s": time.perf_counter() - T0, "init_s": init_s, "optimizer": optimizer, "lr": lr,
                       "n_w": layout.n_w, "train_points": got.train_points, "test_points": len(yt)},
                      history, PS.samples, PS.updates)
        # The rendezvous file goes once every trainer has left rpc.shutdown(), which may still
        # use it: a trainer whose file was gone spun there for good (2 ranks: every time).
        left = [args.out / f".trainer{r}.left" for r in range(1, size)]
        deadline = time.monotonic() + args.timeout
        while not all(f.exists() for f in left) and time.monotonic() < deadline:
            time.sleep(0.02)
        for f in (rendezvous, *left):
            f.unlink(missing_ok=True)
    else:
        (args.out / f".trainer{rank}.left").touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
