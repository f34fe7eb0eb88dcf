"""Moving from torchsort to rankwise: change one import.

rankwise's ``soft_rank`` / ``soft_sort`` default to the isotonic method of torchsort (Blondel et
al., "Fast Differentiable Sorting and Ranking") and take the same keyword arguments, so code
written for torchsort runs unchanged with

    import rankwise as torchsort      # instead of: import torchsort

and gives the same values and gradients (ascending ranks along the last dimension,
``regularization="l2"`` or ``"kl"``, ``regularization_strength``), without compiling an
extension. rankwise adds ``dim=`` and ``descending=``, any leading dimensions, and other methods
(``method="neuralsort"``, ...). If torchsort is installed, this script also checks that both give
the same numbers. Run:

    python examples/from_torchsort.py
"""

from __future__ import annotations

import argparse
import importlib.util

import torch

import rankwise as torchsort  # the one changed line


# ---- code written for torchsort, unchanged ------------------------------------------------------
def spearman(pred: torch.Tensor, target: torch.Tensor, **kw: float) -> torch.Tensor:
    """Differentiable Spearman correlation of each row of ``pred`` with the same row of ``target``."""
    pred = torchsort.soft_rank(pred, **kw)
    target = torchsort.soft_rank(target, **kw)
    pred = pred - pred.mean(dim=-1, keepdim=True)
    target = target - target.mean(dim=-1, keepdim=True)
    return (pred * target).sum(-1) / (pred.norm(dim=-1) * target.norm(dim=-1))


def train(pred: torch.Tensor, target: torch.Tensor, steps: int) -> torch.Tensor:
    pred = pred.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([pred], lr=0.1)
    for _ in range(steps):
        loss = 1 - spearman(pred, target, regularization_strength=0.1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return pred.detach()


x = torch.tensor([[8.0, 0.0, 5.0, 3.0, 2.0, 1.0, 6.0, 7.0, 9.0]])
print("soft_sort:", torchsort.soft_sort(x, regularization_strength=1.0))
print("soft_rank:", torchsort.soft_rank(x, regularization_strength=1.0))
print("soft_rank kl:", torchsort.soft_rank(x, regularization="kl", regularization_strength=1.0))
# -------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="fewer optimization steps (smoke test)")
    args = parser.parse_args()

    torch.manual_seed(0)
    pred, target = torch.randn(4, 50), torch.randn(4, 50)
    before = spearman(pred, target, regularization_strength=1e-3)
    after = spearman(train(pred, target, steps=5 if args.tiny else 100), target, regularization_strength=1e-3)
    print(f"Spearman before {before.mean().item():.3f}, after optimizing the predictions {after.mean().item():.3f}")

    if importlib.util.find_spec("torchsort") is None:
        print("torchsort is not installed: nothing to compare with")
        return
    import torchsort as original

    for kw in ({"regularization_strength": 1.0}, {"regularization": "kl", "regularization_strength": 0.5}):
        y = torch.randn(16, 100, dtype=torch.float64, requires_grad=True)
        ours, theirs = torchsort.soft_rank(y, **kw), original.soft_rank(y, **kw)
        g = torch.randn_like(y)
        (grad_ours,) = torch.autograd.grad(ours, y, g)
        (grad_theirs,) = torch.autograd.grad(theirs, y, g)
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(grad_ours, grad_theirs)
        torch.testing.assert_close(torchsort.soft_sort(y, **kw), original.soft_sort(y, **kw))
    print("same values and gradients as torchsort", original.__version__ if hasattr(original, "__version__") else "")


if __name__ == "__main__":
    main()
