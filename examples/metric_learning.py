"""Metric learning with ``loss(embeddings, labels)``, the calling convention of pytorch-metric-learning.

rankwise's contrastive losses accept one embedding per example, ``(B, D)``, and integer class
labels ``(B,)``, as pytorch-metric-learning's losses do. Where a pytorch-metric-learning user writes

    losses.SupConLoss(temperature=0.1)(embeddings, labels)
    losses.TripletMarginLoss(margin=0.2)(embeddings, labels, miners.BatchHardMiner()(embeddings, labels))
    losses.NTXentLoss(temperature=0.5)(embeddings, indices_of_the_two_views)

the rankwise equivalents are

    rankwise.losses.SupConLoss(temperature=0.1)(embeddings, labels)
    rankwise.losses.TripletLoss(margin=0.2, mining="hard", distance="euclidean")(embeddings, labels)
    rankwise.losses.SupConLoss(temperature=0.5)(torch.stack([view1, view2], dim=1))  # SimCLR: no labels

(embeddings are L2-normalized inside, ``normalize=True``). They also take several views per
example, ``(B, V, D)``. This script trains a small embedding network on scikit-learn's digits with
each of SupCon and batch-hard triplet loss and reports the 1-nearest-neighbour accuracy of the test
images in the embedding space. Run:

    python examples/metric_learning.py          # 20 epochs per loss; ~20 s of CPU
    python examples/metric_learning.py --tiny   # 1 epoch (used by the tests)

Needs scikit-learn (in the ``train`` extra) for the data.
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from rankwise.losses import SupConLoss, TripletLoss


def knn_accuracy(train_emb: torch.Tensor, train_y: torch.Tensor, test_emb: torch.Tensor, test_y: torch.Tensor) -> float:
    """1-nearest-neighbour accuracy with cosine similarity."""
    a = nn.functional.normalize(test_emb, dim=-1)
    b = nn.functional.normalize(train_emb, dim=-1)
    nearest = (a @ b.T).argmax(dim=-1)
    return (train_y[nearest] == test_y).float().mean().item()


def train(loss_fn: nn.Module, data: tuple[torch.Tensor, ...], epochs: int) -> float:
    x_train, x_test, y_train, y_test = data
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(x_train)).split(128):
            embeddings = net(x_train[idx])  # (B, D)
            loss = loss_fn(embeddings, y_train[idx])  # the pytorch-metric-learning call
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    net.eval()
    with torch.no_grad():
        return knn_accuracy(net(x_train), y_train, net(x_test), y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="one epoch (smoke test)")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    data = tuple(train_test_split(x, y, test_size=0.3, random_state=0))
    epochs = 1 if args.tiny else args.epochs
    print(f"raw pixels (no training): test 1-NN accuracy {knn_accuracy(data[0], data[2], data[1], data[3]):.3f}")
    for name, loss_fn in [
        ("SupCon", SupConLoss(temperature=0.1)),
        ("triplet, batch-hard", TripletLoss(margin=0.2, mining="hard", distance="euclidean")),
    ]:
        print(f"{name}: test 1-NN accuracy {train(loss_fn, data, epochs):.3f}")


if __name__ == "__main__":
    main()
