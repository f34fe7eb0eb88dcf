"""Learn a latent permutation: unscramble shuffled digit tiles with Gumbel-Sinkhorn (Mena et al.'s jigsaw task).

Mena et al., ICLR 2018, "Learning Latent Permutations with Gumbel-Sinkhorn Networks". Each 8 x 8 digit of
scikit-learn's bundled ``load_digits`` is cut into 2 x 2 tiles of 4 x 4 pixels and the tiles are shuffled.
A small network scores every (shuffled tile, position) pair from the tile alone, ``log_alpha`` of shape
``(4, 4)``; :func:`rankwise.gumbel_sinkhorn` turns it into nearly doubly stochastic matrices ``P``, the
tiles are put back with ``P^T`` and the loss is the squared error to the unshuffled image: the
permutation is never supervised. At test time :func:`rankwise.matching` (the Hungarian algorithm) gives
the hard assignment. Run:

    python examples/gumbel_sinkhorn_jigsaw.py          # 30 epochs: ~89% of the test tiles and ~81% of the
                                                       # test images placed right (chance: 25%); ~1.5 min of CPU
    python examples/gumbel_sinkhorn_jigsaw.py --tiny   # 2 epochs on little data (used by the tests)
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import rankwise

GRID = 2  # tiles per side
TILE = 8 // GRID


def tiles_of(images: torch.Tensor) -> torch.Tensor:
    """``(N, 8, 8)`` images -> ``(N, GRID * GRID, TILE * TILE)`` tiles, row-major."""
    n = images.shape[0]
    t = images.reshape(n, GRID, TILE, GRID, TILE).permute(0, 1, 3, 2, 4)
    return t.reshape(n, GRID * GRID, TILE * TILE)


def scramble(tiles: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffled tiles and ``perm``: shuffled tile ``j`` is the tile of position ``perm[:, j]``."""
    n, m, _ = tiles.shape
    perm = torch.rand(n, m, generator=generator).argsort(-1)
    return tiles.gather(1, perm.unsqueeze(-1).expand_as(tiles)), perm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps on little data (smoke test)")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    images = torch.tensor(load_digits().images, dtype=torch.float32) / 16.0
    order = torch.randperm(len(images), generator=g)
    train, test = tiles_of(images[order[:1400]]), tiles_of(images[order[1400:]])
    epochs = 2 if args.tiny else args.epochs
    if args.tiny:
        train = train[:256]

    m = GRID * GRID
    # scores of "this tile belongs at position k" from the tile alone (shared across tiles)
    model = nn.Sequential(nn.Linear(TILE * TILE, 64), nn.ReLU(), nn.Linear(64, m))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    noise = torch.Generator().manual_seed(1)
    for _epoch in range(epochs):
        shuffled, _ = scramble(train, g)  # fresh shuffles every epoch
        for idx in torch.randperm(len(train), generator=g).split(64):
            log_alpha = model(shuffled[idx])  # (B, shuffled tile j, position k)
            p = rankwise.gumbel_sinkhorn(log_alpha, temperature=1.0, n_iters=20, n_samples=5, generator=noise)
            recon = torch.einsum("sbjk,bjd->sbkd", p, shuffled[idx])  # position k gets sum_j P[j, k] tile j
            loss = (recon - train[idx]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    shuffled, perm = scramble(test, torch.Generator().manual_seed(2))
    with torch.no_grad():
        guess = rankwise.matching(model(shuffled))  # guess[:, j]: the position of shuffled tile j
    tiles_right = (guess == perm).float().mean()
    images_right = (guess == perm).all(-1).float().mean()
    print(f"test tiles placed right {tiles_right:.3f}, images entirely right {images_right:.3f} (chance {1 / m:.3f})")


if __name__ == "__main__":
    main()
