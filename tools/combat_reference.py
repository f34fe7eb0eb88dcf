"""Reference ComBat fits from neuroCombat (Fortin et al., NeuroImage 2018; PyPI ``neuroCombat==0.2.12``).

Runs ``neuroCombat`` with and without empirical Bayes on seeded data (3 sites of 30/25/35 subjects, 6
features, a categorical ``sex`` and a continuous ``age`` covariate) and writes the inputs, the harmonised
data and the site effects to ``tests/reference/combat_reference.npz``, which
``tests/test_brain_age_combat.py`` compares :func:`rankwise.brain_age.combat_fit` with. The ages are
multiples of 1/8, exact in float32, because neuroCombat casts continuous covariates to float32.

    pip install neuroCombat==0.2.12 && python tools/combat_reference.py
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "reference" / "combat_reference.npz"


def main() -> None:
    import pandas as pd
    from neuroCombat import neuroCombat

    rng = np.random.default_rng(7)
    n = 90
    sites = np.repeat(np.array(["s0", "s1", "s2"]), [30, 25, 35])
    age = np.round(rng.uniform(20, 80, n) * 8) / 8
    sex = rng.integers(0, 2, n).astype(np.float64)
    scale = np.where(sites == "s1", 2.0, 1.0)[:, None]
    shift = np.where(sites == "s2", 1.5, 0.0)[:, None]
    y = rng.normal(size=(n, 6)) * scale + shift + 0.05 * age[:, None] + 0.3 * sex[:, None]
    cov = pd.DataFrame({"site": sites, "age": age, "sex": sex})
    out = {"data": y, "sites": sites, "age": age, "sex": sex}
    for eb in (True, False):
        with contextlib.redirect_stdout(io.StringIO()):  # neuroCombat prints its steps
            r = neuroCombat(y.T.copy(), cov, "site", categorical_cols=["sex"], continuous_cols=["age"], eb=eb)
        tag = "eb" if eb else "ls"
        out[f"{tag}_harmonized"] = np.asarray(r["data"]).T
        out[f"{tag}_gamma"] = np.asarray(r["estimates"]["gamma.star"])
        out[f"{tag}_delta"] = np.asarray(r["estimates"]["delta.star"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(OUT)


if __name__ == "__main__":
    main()
