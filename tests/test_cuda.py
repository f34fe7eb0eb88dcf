"""Every registered operator and loss on CUDA (``cuda`` marker; skipped without a CUDA device).

For each registry entry, on its example inputs:

* forward values and input gradients on CUDA equal those on CPU (float64; stochastic entries draw
  from another generator on each device, so only shapes and finiteness are compared);
* forward + backward run under ``torch.cuda.set_sync_debug_mode("error")`` without a host
  synchronization (after one warm-up call: Triton compilation, cached constants), except the
  entries listed in ``KNOWN_SYNC`` with the reason;
* under ``torch.autocast("cuda", float16 / bfloat16)`` the outputs keep the dtype they have without
  autocast (docs/conventions.md: an operator returns the dtype of its input, ranks float32, a loss
  its compute dtype) and are finite wherever the float32 outputs are.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rankwise._registry import Example, RegistryEntry
from tests.registry_examples import entry_factories, registry_cases
from tests.registry_helpers import tensors as _tensors

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ENTRIES: list[tuple[str, RegistryEntry]] = registry_cases()  # every entry and every test variant
IDS = [f"{kind}:{e.name}" for kind, e in ENTRIES]

#: entries that synchronize with the host on CUDA, and why (a synchronization elsewhere fails the test)
KNOWN_SYNC: dict[str, str] = {}


def _moved(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor copied to ``device`` (leaves stay leaves that require grad)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone().to(device).requires_grad_(obj.requires_grad)
    if isinstance(obj, tuple):
        return tuple(_moved(o, device) for o in obj)
    if isinstance(obj, list):
        return [_moved(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _moved(v, device) for k, v in obj.items()}
    return obj


def _run(entry: RegistryEntry, ex: Example, *, autocast: torch.dtype | None = None) -> tuple[list, list]:
    """Floating outputs and the gradients of the inputs that require grad (``None`` if none reached)."""
    if entry.stochastic:
        torch.manual_seed(1234)
    if autocast is None:
        outs = _tensors(entry.fn(*ex.args, **ex.kwargs))
    else:
        with torch.autocast("cuda", dtype=autocast):
            outs = _tensors(entry.fn(*ex.args, **ex.kwargs))
    outs = [t for t in outs if t.is_floating_point()]
    grads: list[torch.Tensor | None] = []
    if entry.gradient != "none" and outs:
        total = sum(
            (t.float() * torch.linspace(0.5, 1.5, t.numel(), device=t.device).reshape(t.shape)).sum() * (i + 1)
            for i, t in enumerate(outs)
        )
        if isinstance(total, torch.Tensor) and total.requires_grad:
            total.backward()
        grads = [a.grad for a in ex.args if isinstance(a, torch.Tensor) and a.requires_grad]
    return outs, grads


def _example(entry: RegistryEntry, dtype: torch.dtype) -> Example:
    return entry_factories(entry).example(dtype, torch.device("cpu"))


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_cuda_equals_cpu(kind: str, entry: RegistryEntry) -> None:
    ex = _example(entry, torch.float64)
    ex_cuda = Example(_moved(ex.args, torch.device("cuda")), _moved(ex.kwargs, torch.device("cuda")))
    outs, grads = _run(entry, ex)
    outs_c, grads_c = _run(entry, ex_cuda)
    assert len(outs) == len(outs_c) and len(grads) == len(grads_c)
    for a, b in zip(outs + grads, outs_c + grads_c):
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert b.device.type == "cuda" and a.shape == b.shape and a.dtype == b.dtype
        if entry.stochastic:
            assert torch.isfinite(a).all() == torch.isfinite(b).all()
        else:
            torch.testing.assert_close(b.cpu(), a, rtol=1e-6, atol=1e-8, equal_nan=True)


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_cuda_no_host_sync(kind: str, entry: RegistryEntry) -> None:
    ex = _example(entry, torch.float32)
    _run(entry, Example(_moved(ex.args, torch.device("cuda")), _moved(ex.kwargs, torch.device("cuda"))))  # warm-up
    args, kwargs = _moved(ex.args, torch.device("cuda")), _moved(ex.kwargs, torch.device("cuda"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _run(entry, Example(args, kwargs))
    except RuntimeError as exc:
        if "synchroniz" in str(exc) and entry.name in KNOWN_SYNC:
            pytest.xfail(KNOWN_SYNC[entry.name])
        raise
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_cuda_autocast(kind: str, entry: RegistryEntry, half: torch.dtype) -> None:
    ex = _example(entry, torch.float32)
    ref, _ = _run(entry, Example(_moved(ex.args, torch.device("cuda")), _moved(ex.kwargs, torch.device("cuda"))))
    ex_c = Example(_moved(ex.args, torch.device("cuda")), _moved(ex.kwargs, torch.device("cuda")))
    outs, grads = _run(entry, ex_c, autocast=half)
    assert len(outs) == len(ref)
    for t, r in zip(outs, ref):
        assert t.dtype == r.dtype, f"{entry.name}: {t.dtype} under autocast({half}), {r.dtype} without"
        finite = torch.isfinite(r)
        assert torch.isfinite(t[finite]).all(), f"{entry.name}: non-finite output under autocast({half})"
    for g in grads:
        assert g is None or torch.isfinite(g).all(), f"{entry.name}: non-finite gradient under autocast({half})"


def test_listmle_draws_on_the_generator_device() -> None:
    """ListMLE's tie-breaking permutation: a CUDA generator draws on the device (the same seed, the
    same loss), the default draws on the CPU as allRank does and is copied without a host sync (the
    same loss as on CPU); a generator on another device than the scores is refused, naming it."""
    from rankwise.losses import listmle_loss

    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 6, generator=gen).cuda().requires_grad_()
    t = torch.randint(0, 2, (4, 6), generator=gen).float().cuda()
    first = listmle_loss(p, t, generator=torch.Generator("cuda").manual_seed(3))
    again = listmle_loss(p, t, generator=torch.Generator("cuda").manual_seed(3))
    assert torch.equal(first, again) and first.device.type == "cuda"
    # distinct labels: the CPU and CUDA sorts order ties differently, whatever the shuffle
    t = torch.stack([torch.randperm(6, generator=gen) for _ in range(4)]).float().cuda()
    torch.manual_seed(5)
    on_cpu = listmle_loss(p.detach().cpu(), t.cpu())
    torch.manual_seed(5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu = listmle_loss(p, t)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(on_gpu.cpu(), on_cpu)
    with pytest.raises(ValueError, match="`generator`"):
        listmle_loss(p.detach().cpu(), t.cpu(), generator=torch.Generator("cuda"))


def test_isotonic_long_rows_pieces_equal_one_pav() -> None:
    """A long CUDA row cut into pieces (PAV per piece, then over their blocks) gives the blocks,
    values and gradients of one sequential PAV, on pooling and on non-pooling rows, l2 and kl."""
    from rankwise._kernels import triton_isotonic as tk

    n = 50_000
    gen = torch.Generator().manual_seed(11)
    for kl in (False, True):
        w = torch.arange(n, 0, -1, dtype=torch.float64).unsqueeze(0)
        w = (w.log() if kl else w).cuda()
        for s in (
            torch.randn(2, n, generator=gen, dtype=torch.float64).sort(-1, descending=True).values * 30,
            (torch.arange(n, 0, -1, dtype=torch.float64) * 10.0).expand(2, n),
        ):
            s = s.cuda().contiguous()
            g = torch.randn(2, n, generator=gen, dtype=torch.float64).cuda()
            mu, state = tk.projection_forward(s, w, kl)
            mu1, state1 = tk.projection_forward(s, w, kl, chunk=n)
            assert tk._chunk_length(2, n, s.device) < n
            assert torch.equal(state[0], state1[0])
            torch.testing.assert_close(mu, mu1, rtol=1e-12, atol=1e-9)
            for a, b in zip(
                tk.projection_backward(g, s, w, state, kl, True, True),
                tk.projection_backward(g, s, w, state1, kl, True, True),
                strict=True,
            ):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-9)
