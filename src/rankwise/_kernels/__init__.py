"""The kernel layer of rankwise: the one place that imports numba, ctypes and the OpenMP runtime.

Families (each a module with a small typed interface of CPU tensor functions):

* :mod:`~rankwise._kernels.sort` -- stable row sort of float32 rows (radix sort);
* :mod:`~rankwise._kernels.isotonic` -- pool-adjacent-violators soft rank / soft sort;
* :mod:`~rankwise._kernels.supcon` -- the small-batch SupCon pass;
* :mod:`~rankwise._kernels.rnc` -- Rank-N-Contrast orders and running log-sum-exps;
* :mod:`~rankwise._kernels.ranksim` -- RankSim's label ranks;
* :mod:`~rankwise._kernels.ltr` -- ListNet and ListMLE, value and gradient in one pass per list;
* :mod:`~rankwise._kernels.lapsum` -- LapSum soft rank / sort / top-k, forward and analytic backward.

Shared machinery: :mod:`~rankwise._kernels._loader` (one lazy loader, the ``RANKWISE_NUMBA``
policy parsed once), :mod:`~rankwise._kernels._parallel` (the row-parallel dispatcher: torch's
OpenMP team through ``GOMP_parallel``, or Python threads), :mod:`~rankwise._kernels._custom`
(every entry point is a ``torch.library`` custom operator under ``torch.compile``), and the numba
modules ``_numba_*`` (imported only by the loader). The operators and losses keep their autograd
Functions and call the interface; whether a kernel runs in numba or torch is decided here.

Importing this package imports neither numba nor the families' kernels.
"""

from __future__ import annotations

from rankwise._kernels import isotonic, lapsum, ltr, ranksim, rnc, sort, supcon

__all__ = ["isotonic", "lapsum", "ltr", "ranksim", "rnc", "sort", "supcon"]
