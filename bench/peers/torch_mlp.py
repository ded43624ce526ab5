"""The PyTorch peers of asgd's worker step (bench_kernel): the same 2-H-2 MLP step from the
same weights, as a typical PyTorch user writes it and by hand on preallocated tensors."""

import numpy as np


def torch_steps(layout, w, X, y, lr):
    """(typical user's step, hand-written step): both apply w -= lr*grad to their own copy of w."""
    import torch
    from torch import nn
    torch.set_num_threads(1)
    W1, b1, W2, b2 = layout.views(w)
    model = nn.Sequential(nn.Linear(layout.d_in, layout.d_hidden), nn.Sigmoid(),
                          nn.Linear(layout.d_hidden, layout.d_out)).double()
    with torch.no_grad():
        for p, v in zip(model.parameters(), (W1.T, b1, W2.T, b2)):
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))
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
