"""The kernel layer (``rankwise._kernels``): one place for numba / ctypes / the OpenMP runtime, one
loader, and fork safety of the row-parallel dispatcher."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise._kernels import _loader

SRC = Path(__file__).resolve().parents[2] / "src" / "rankwise"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_the_kernel_layer_imports_numba_and_ctypes() -> None:
    offenders = []
    for p in SRC.rglob("*.py"):
        inside = p.relative_to(SRC).parts[0] == "_kernels"
        if not inside and _imported_roots(p) & {"numba", "ctypes"}:
            offenders.append(str(p.relative_to(SRC)))
        if not inside and 'RANKWISE_NUMBA"' in p.read_text() and "environ" in p.read_text():
            offenders.append(f"{p.relative_to(SRC)} (reads RANKWISE_NUMBA)")
    assert offenders == []


def test_import_does_not_load_numba_or_dynamo() -> None:
    code = "import sys, rankwise; print('numba' in sys.modules, 'torch._dynamo' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["False", "False"]


def test_unknown_mode_warns_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKWISE_NUMBA", "fast")
    with pytest.warns(RuntimeWarning, match="RANKWISE_NUMBA must be one of"):
        assert _loader._parse_mode() == "background"
    monkeypatch.setenv("RANKWISE_NUMBA", " Off ")
    assert _loader._parse_mode() == "off"


def test_loaded_family_takes_no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once loaded, ``get`` neither locks nor starts a thread (the path ``torch.compile`` traces)."""
    from rankwise._kernels import isotonic

    if isotonic.FAMILY.load() is None:
        pytest.skip("numba unavailable")

    class Boom:
        def __enter__(self) -> None:
            raise AssertionError("lock taken")

        def __exit__(self, *a: object) -> None:
            return None

    monkeypatch.setattr(isotonic.FAMILY, "_lock", Boom())
    monkeypatch.setattr(isotonic.FAMILY, "_start", lambda: (_ for _ in ()).throw(AssertionError("thread")))
    for mode in _loader.MODES[:2]:
        monkeypatch.setattr(_loader, "MODE", mode)
        assert isotonic.ready(4, 8) and isotonic.FAMILY.get() is not None


def test_the_loading_thread_keeps_the_filters_the_main_thread_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter added while a family loads in its thread stays (a catch_warnings() in the thread would
    restore its snapshot of the process-wide filters and drop it); a failed background load is reported
    once by the next caller, not swallowed."""
    import threading
    import warnings

    entered, release = threading.Event(), threading.Event()

    def warm(module: object) -> None:
        entered.set()
        release.wait(10)
        raise ImportError("no kernels here")

    fam = _loader.Family("test_family", "rankwise._kernels._loader", warm, start_after=1, warn=True)
    monkeypatch.setattr(_loader, "MODE", "background")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert fam.get() is None  # starts the thread
        assert entered.wait(10)
        warnings.filterwarnings("ignore", message="a filter added meanwhile")
        release.set()
        assert fam._thread is not None
        fam._thread.join(10)
        assert any(f[1] is not None and f[1].pattern == "a filter added meanwhile" for f in warnings.filters)
        assert fam.get() is None
        assert fam.get() is None
    msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "numba is unavailable" in msgs[0] and "no kernels here" in msgs[0]


_FORK_SCRIPT = """
import os, sys, torch, rankwise
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 256, generator=g)
ref_soft = rankwise.soft_rank(x, method="isotonic", regularization_strength=0.5)
ref_rank = rankwise.rank(torch.randn(512, 512, generator=g))  # the row sort on the team too
pid = os.fork()
if pid == 0:
    ok = True
    try:
        torch.set_num_threads(1)  # as DataLoader workers do (torch's own ops hang on libgomp otherwise)
        soft = rankwise.soft_rank(x, method="isotonic", regularization_strength=0.5)
        ok &= torch.allclose(soft, ref_soft, rtol=1e-6, atol=1e-6)
        ok &= torch.equal(rankwise.rank(x), rankwise.rank(x.double()).float())
    except BaseException as exc:
        print("child:", repr(exc), file=sys.stderr)
        ok = False
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(x), batch_size=64, num_workers=2, multiprocessing_context="fork",
    collate_fn=lambda b: rankwise.soft_rank(
        torch.stack([t[0] for t in b]), method="isotonic", regularization_strength=0.5
    ),
)
got = torch.cat(list(loader))
print("loader", bool(torch.allclose(got, ref_soft, rtol=1e-6, atol=1e-6)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_after_two_threads_is_correct_and_does_not_hang() -> None:
    """After the parent ran soft ranks and row sorts on torch's OpenMP team (2 threads), a forked
    child on one thread and fork-started DataLoader workers give the same values (no hang: the run
    has a time limit). A child that sets two threads again hangs in torch's own ops (libgomp), not
    only in the kernels; the layer never starts a team there (``_parallel`` fork handler)."""
    env = {**os.environ, "RANKWISE_NUMBA": "sync"}
    res = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["child", "0", "loader", "True"], res.stdout + res.stderr[-2000:]


@pytest.mark.parametrize(
    ("dtype", "rows", "n", "threads"),
    [
        ("float32", 1, 100, 1),
        ("float32", 3, 7, 1),
        ("float64", 3, 7, 1),
        ("float64", 2, 3000, 1),
        ("float32", 64, 600, 2),
    ],
)
def test_rank_forward_checked_reads_the_magnitude_of_the_finite_rows(
    dtype: str, rows: int, n: int, threads: int
) -> None:
    """The magnitude check read by the kernels (serial, sorted-outside float64, and team paths)
    equals the largest |x| of the rows without NaN/inf, computed by torch."""
    import torch

    from rankwise._kernels import isotonic

    if isotonic.FAMILY.require() is None:
        pytest.skip("numba unavailable")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows * n), dtype=getattr(torch, dtype))
        x[0, n // 2] = -7e30  # the largest magnitude, in a finite row
        *_, magnitude, finite = isotonic.rank_forward_checked(x, 0.5, False, False)
        assert finite and magnitude == float(x.abs().max())
        if rows > 1:
            x[0, 1] = float("nan")  # the row with the largest entry is left out
            x[-1, 0] = float("inf")
            *_, magnitude, finite = isotonic.rank_forward_checked(x, 0.5, True, True)
            expect = float(x[1:-1].abs().max()) if rows > 2 else 0.0
            assert not finite and magnitude == expect
    finally:
        torch.set_num_threads(old)
