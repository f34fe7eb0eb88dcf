"""The per-digit-reader ceiling of the large-MNIST sorting task (docs/results.md, section 1).

A digit classifier (the sorting recipe's ``small_cnn`` + a linear layer, cross-entropy) is trained on
the same training digits as the sorting runs (mnist5k's training split minus the sort recipe's
validation digits, ``task.val_fraction`` 0.1), then reads every digit of the sort recipe's fixed test
lists (the same lists, seed ``TEST_SEED``); a list counts as sorted when the numbers read put it in
the true order. A sorting network supervised only by orders cannot read digits better than a
classifier supervised by every digit's label, so this is a practical ceiling for the sort recipe
at that resolution::

    python tools/digit_reader_ceiling.py --downsample 2 --epochs 8 --n 3,5,7,15 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--downsample", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--n", default="3,5,7")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from rankwise.data import get_dataset
    from rankwise.models import build_backbone
    from rankwise.recipes import load_config
    from rankwise.recipes.sorting import TEST_SEED, ListSampler, RandomLists, digit_pools

    t0 = time.perf_counter()
    cfg = load_config("large_mnist_neuralsort")
    data = get_dataset("mnist5k", **cfg.data.options)
    xtr, ytr, _, _, xte, yte = digit_pools(SimpleNamespace(data=data, cfg=cfg))  # type: ignore[arg-type]
    xtr = xtr if xtr.dim() == 4 else xtr.unsqueeze(1)
    torch.manual_seed(a.seed)
    backbone = build_backbone("small_cnn", in_channels=1, feature_dim=64)
    net = nn.Sequential(backbone[0] if isinstance(backbone, tuple) else backbone, nn.Linear(64, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(a.seed)

    def prep(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, a.downsample) if a.downsample > 1 else x

    for _ in range(a.epochs):
        net.train()
        for idx in torch.randperm(len(ytr), generator=g).split(64):
            loss = F.cross_entropy(net(prep(xtr[idx])), ytr[idx].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    xte4 = xte if xte.dim() == 4 else xte.unsqueeze(1)
    with torch.no_grad():
        digit_acc = float((net(prep(xte4)).argmax(-1) == yte).float().mean())
    out: dict[str, object] = {"downsample": a.downsample, "epochs": a.epochs, "digit_accuracy": digit_acc}
    for n in (int(v) for v in a.n.split(",")):
        lists = RandomLists(ListSampler(xte, yte, n, 4), 1000, TEST_SEED)
        ok_all, ok_pos = 0.0, 0.0
        with torch.no_grad():
            for i in range(len(lists)):
                img, v = lists[i]  # (n, 1, 28, 112), (n,)
                digits = img.view(n, 1, 28, 4, 28).permute(0, 3, 1, 2, 4).reshape(n * 4, 1, 28, 28)
                read = net(prep(digits)).argmax(-1).view(n, 4)
                number = (read * torch.tensor([1000, 100, 10, 1])).sum(-1).double()
                ok = number.argsort(descending=True, stable=True) == v.double().argsort(descending=True)
                ok_all += float(ok.all())
                ok_pos += float(ok.float().mean())
        out[f"n{n}"] = {"all_correct": ok_all / len(lists), "rank_correct": ok_pos / len(lists)}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
