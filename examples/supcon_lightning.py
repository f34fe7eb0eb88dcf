"""Supervised contrastive learning (SupCon) in a LightningModule, then a linear probe.

Data: scikit-learn's handwritten digits (1,797 images of 8 x 8 pixels, shipped with scikit-learn,
no download). Each training image is seen as two augmented views (a random shift of up to one
pixel and a little noise); ``supcon_loss`` pulls together the views of all images of the same
digit. A logistic regression on the frozen encoder's features then measures how well the classes
are separated (linear-probe accuracy). Run:

    python examples/supcon_lightning.py          # 30 epochs, probe accuracy about 0.96; ~40 s of CPU
    python examples/supcon_lightning.py --tiny   # 1 epoch (used by the tests)

Needs the ``train`` extra (Lightning, scikit-learn).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rankwise.losses import supcon_loss


def augment(images: torch.Tensor) -> torch.Tensor:
    """A random shift by -1, 0 or 1 pixel in each direction, plus Gaussian noise; images (B, 8, 8)."""
    dx, dy = torch.randint(-1, 2, (2,)).tolist()
    shifted = torch.roll(images, shifts=(dy, dx), dims=(1, 2))
    return shifted + 0.1 * torch.randn_like(shifted)


class SupConModel(L.LightningModule):
    def __init__(self, temperature: float = 0.1, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU())
        self.projection = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        views = torch.stack([augment(images), augment(images)], dim=1)  # (B, 2, 8, 8)
        z = self.projection(self.encoder(views.flatten(0, 1))).unflatten(0, (len(images), 2))  # (B, 2, 32)
        loss = supcon_loss(z, labels, temperature=self.hparams.temperature)  # normalizes z itself
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def features(model: SupConModel, images: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model.encoder(images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="one epoch (smoke test)")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(images, labels, test_size=0.3, random_state=0)

    model = SupConModel()
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=128, shuffle=True, drop_last=True)
    trainer = L.Trainer(
        max_epochs=1 if args.tiny else args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, loader)

    probe = LogisticRegression(max_iter=2000).fit(features(model, x_train).numpy(), y_train.numpy())
    accuracy = probe.score(features(model, x_test).numpy(), y_test.numpy())
    print(f"final train loss {trainer.callback_metrics['train_loss'].item():.3f}, linear-probe accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
