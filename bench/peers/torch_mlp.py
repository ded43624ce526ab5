"""asgd's MLP and optimizers as PyTorch spells them, for the PyTorch peers: the model with
asgd's weights, the torch.optim class that makes asgd's update, and the worker's step as a
typical PyTorch user writes it and by hand on preallocated tensors (bench_kernel)."""

import numpy as np


def torch_mlp(layout, w):
    """torch's d_in-H-d_out MLP (sigmoid hidden layer, float64) with asgd's weights w."""
    import torch
    from torch import nn
    W1, b1, W2, b2 = layout.views(w)
    model = nn.Sequential(nn.Linear(layout.d_in, layout.d_hidden), nn.Sigmoid(),
                          nn.Linear(layout.d_hidden, layout.d_out)).double()
    with torch.no_grad():
        for p, v in zip(model.parameters(), (W1.T, b1, W2.T, b2)):
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return model


def torch_optimizer(name: str, params, lr: float):
    """The torch.optim optimizer that makes asgd.net.optimizers' update `name` (same
    hyper-parameters; torch's momentum keeps v/lr where asgd keeps v, the same steps)."""
    import torch
    from asgd.net import optimizers
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=optimizers.MOMENTUM)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=optimizers.EPS)   # torch's default eps is 1e-10
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=optimizers.BETAS, eps=optimizers.EPS)
    raise ValueError(f"optimizer must be one of {optimizers.OPTIMIZERS}, got {name!r}")


def torch_steps(layout, w, X, y, lr):
    """(typical user's step, hand-written step): both apply w -= lr*grad to their own copy of w."""
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
    h, dh = torch.empty(B, layout.d_hidden, dtype=torch.float64), torch.empty(B, layout.d_hidden, dtype=torch.float64)
    z = torch.empty(B, layout.d_out, dtype=torch.float64)
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
        before = [p.detach().clone() for p in model.parameters()]
        typical()
        d = [(p.detach() - b).numpy() for p, b in zip(model.parameters(), before)]
        return np.concatenate([d[0].T.ravel(), d[1], d[2].T.ravel(), d[3]])
    return typical, manual, delta_typical
