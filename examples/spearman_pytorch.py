"""Train a regressor whose predictions are ranked like the targets: a plain PyTorch loop with ``spearman_loss``.

The data are synthetic: 8 features and a monotone but non-linear target (``exp``) with noise. The
differentiable Spearman loss (SoDeep's, on isotonic soft ranks) optimizes the order of the
predictions within each batch; a small L1 term fixes their scale (ranks alone do not). Run:

    python examples/spearman_pytorch.py          # 10 epochs, test Spearman about 0.98; ~15 s of CPU
    python examples/spearman_pytorch.py --tiny   # 2 epochs on little data (used by the tests)
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from rankwise.losses import spearman_correlation, spearman_loss


def make_data(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=generator)
    w = torch.linspace(-1.0, 1.0, 8)
    y = torch.exp(x @ w / 2) + 0.1 * torch.randn(n, generator=generator)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps on little data (smoke test)")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    epochs, n_train = (2, 512) if args.tiny else (args.epochs, 8192)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x_train, y_train = make_data(n_train, g)
    x_test, y_test = make_data(2048, g)

    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        model.train()
        for idx in torch.randperm(n_train).split(128):  # batches of 128: the ranks are within a batch
            pred = model(x_train[idx]).squeeze(-1)
            # soft ranks of the predictions vs the exact ranks of the targets, plus 0.1 x L1
            loss = spearman_loss(pred, y_train[idx], ranker="isotonic", regularization_strength=0.1, l1_weight=0.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            rho = spearman_correlation(
                model(x_test).squeeze(-1), y_test, ranker="isotonic", regularization_strength=1e-3
            )
        print(f"epoch {epoch + 1}: train loss {loss.item():.4f}, test Spearman {rho.item():.3f}")


if __name__ == "__main__":
    main()
