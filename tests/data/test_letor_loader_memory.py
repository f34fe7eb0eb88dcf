"""The LTR training loader densifies no more than a batch of queries beyond the feature matrix."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from rankwise.data import QueryLists, SlateSampler, group_queries, load_letor, pad_lists


def _lists(queries: int = 40, d: int = 7, seed: int = 0) -> QueryLists:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 30, size=queries)
    qid = np.repeat(np.arange(queries), sizes)
    x = rng.normal(size=(len(qid), d)).astype(np.float32)
    y = rng.integers(0, 5, size=len(qid)).astype(np.float32)
    return group_queries(x, y, qid)


def _peak_cpu_bytes(fn) -> int:
    """The largest tensor memory held at once during ``fn()`` (torch's CPU allocator events)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


def test_query_items_are_views_of_the_feature_matrix():
    lists = _lists()
    base = lists.x.untyped_storage().data_ptr()
    for i in range(len(lists)):
        x, y = lists[i]
        assert (
            x.untyped_storage().data_ptr() == base
            and y.untyped_storage().data_ptr() == lists.y.untyped_storage().data_ptr()
        )


def test_a_batch_holds_its_queries_only():
    """Every training batch is ``(Q, L, D)`` with L = its longest (slate-cut) list, and building one
    allocates at most twice that (the slates' copies and the padded batch), never the whole split."""
    lists = _lists(queries=200, d=16)
    slate, batch = 12, 8
    loader = DataLoader(SlateSampler(lists, slate, 0), batch_size=batch, collate_fn=pad_lists)
    d = lists.x.shape[1]
    split_bytes = lists.x.numel() * 4
    for k, (x, y) in enumerate(loader):
        assert x.shape[0] <= batch and x.shape[1] <= slate and x.shape[2] == d
        longest = int((y >= 0).sum(dim=1).max())
        assert x.shape[1] == longest
        if k == 3:
            break
    it = iter(loader)
    peak = _peak_cpu_bytes(lambda: next(it))
    batch_bytes = batch * slate * (d + 1) * 4
    assert 0 < peak <= 2 * batch_bytes + 4096 < split_bytes


def test_evaluation_batches_of_whole_queries():
    lists = _lists(queries=120, d=16)
    loader = DataLoader(lists, batch_size=16, collate_fn=pad_lists)
    it = iter(loader)
    peak = _peak_cpu_bytes(lambda: next(it))
    first = [lists[i] for i in range(16)]
    longest = max(int(y.shape[0]) for _, y in first)
    assert peak <= 16 * longest * (16 + 1) * 4 + 4096  # the padded batch; the items are views
    assert peak < lists.x.numel() * 4 / 2


def test_loader_keeps_one_feature_matrix(tmp_path):
    """load_letor's splits own their arrays (standardised in place), one float32 matrix per split."""
    rng = np.random.default_rng(1)
    for name, n in (("train.txt", 300), ("vali.txt", 50), ("test.txt", 50)):
        lines = [
            f"{rng.integers(0, 3)} qid:{i // 6} " + " ".join(f"{k}:{rng.normal():.4f}" for k in range(1, 11))
            for i in range(n)
        ]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    data = load_letor(str(tmp_path))
    for part in (data.train, data.val, data.test):
        assert part.x.dtype == torch.float32 and part.x.is_contiguous()
        assert part.x.untyped_storage().nbytes() == part.x.numel() * 4  # no larger base behind it
    x = data.train.x.numpy()
    assert np.allclose(x.mean(axis=0), 0, atol=1e-5) and np.allclose(x.std(axis=0), 1, atol=1e-4)
