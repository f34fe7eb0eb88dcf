"""Reference values of the Sinkhorn operator and the matching of Mena et al. from the authors' code.

Mena et al., ICLR 2018, "Learning Latent Permutations with Gumbel-Sinkhorn Networks"; code:
github.com/google/gumbel_sinkhorn (TensorFlow 1). This script takes ``sinkhorn_ops.py`` from a local
mirror of that repository (``git show``, nothing is copied into rankwise), runs it under
TensorFlow 2's ``tf.compat.v1`` API, and writes the deterministic operator
(``gumbel_sinkhorn(..., noise_factor=0)``), its vector-Jacobian products (TensorFlow's autograd
through the authors' iterations) and ``matching`` on fixed inputs to
``tests/ops/data/gumbel_sinkhorn_reference.npz``, which ``tests/ops/test_gumbel_sinkhorn.py``
compares :func:`rankwise.gumbel_sinkhorn` and :func:`rankwise.matching` with. The Gumbel noise
itself comes from each library's own generator and is not compared.

Needs TensorFlow (not a rankwise dependency); run it in an environment that has it:

    python tools/gumbel_sinkhorn_reference.py --mirror /work/.mirror/google+gumbel_sinkhorn/repo
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "ops" / "data" / "gumbel_sinkhorn_reference.npz"


def load_authors_code(mirror: Path, workdir: Path) -> Any:
    """The authors' ``sinkhorn_ops`` module, with ``tensorflow`` bound to ``tf.compat.v1``."""
    import tensorflow as tf

    src = subprocess.run(
        ["git", "-C", str(mirror), "show", "HEAD:sinkhorn_ops.py"], check=True, capture_output=True, text=True
    ).stdout
    path = workdir / "sinkhorn_ops.py"
    path.write_text(src)
    real = sys.modules.get("tensorflow")
    sys.modules["tensorflow"] = tf.compat.v1  # the module is TF1 code
    try:
        spec = importlib.util.spec_from_file_location("sinkhorn_ops", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if real is not None:
            sys.modules["tensorflow"] = real
    return module


def generate(ops: Any) -> dict[str, np.ndarray]:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    data: dict[str, np.ndarray] = {}
    case = 0
    for n, batch in ((1, 2), (3, 4), (5, 3), (8, 2)):
        for dtype in (np.float64, np.float32):
            x = (2 * rng.standard_normal((batch, n, n))).astype(dtype)
            for temp, n_iters in ((1.0, 20), (0.3, 5), (0.1, 50)):
                v = rng.standard_normal((batch, n, n)).astype(dtype)
                xt = tf.constant(x)
                with tf.GradientTape() as tape:
                    tape.watch(xt)
                    sink, _ = ops.gumbel_sinkhorn(xt, temp=temp, n_samples=1, noise_factor=0.0, n_iters=n_iters)
                    loss = tf.reduce_sum(sink * tf.constant(v))
                grad = tape.gradient(loss, xt)
                key = f"{case:04d}"
                data[f"{key}/x"] = x
                data[f"{key}/v"] = v
                data[f"{key}/out"] = sink.numpy()
                data[f"{key}/grad"] = grad.numpy()
                data[f"{key}/matching"] = ops.matching(xt).numpy().astype(np.int64)
                data[f"{key}/meta"] = np.array([str(temp), str(n_iters)])
                case += 1
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", type=Path, required=True, help="a git clone of github.com/google/gumbel_sinkhorn")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = generate(load_authors_code(args.mirror, Path(tmp)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"wrote {len(data) // 6} cases to {args.out}")


if __name__ == "__main__":
    main()
