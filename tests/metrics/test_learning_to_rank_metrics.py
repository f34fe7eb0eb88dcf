"""ndcg / mrr against allRank 1.4.3 on random padded batches, allRank's own metric-test cases, and
map_at_k against scikit-learn's average precision."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import average_precision_score

from rankwise.metrics import map_at_k, mrr, ndcg
from tests.losses._allrank import load

PAD = -1.0


def _batch(seed: int, ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(6, 10, generator=g)
    if ties:
        pred = (pred * 2).round() / 2
    true = torch.randint(0, 4, (6, 10), generator=g).float()
    true[:, 0] = 1.0  # every list has a relevant item (allRank's mrr decides "none" per batch)
    pad = torch.rand(6, 10, generator=g) < 0.3
    pad[:, 0] = False
    return pred, true.masked_fill(pad, PAD)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("ats", [None, [1, 3, 5, 20]])
def test_ndcg_and_mrr_match_allrank(ties: bool, ats: list[int] | None) -> None:
    _, am = load()
    for seed in range(8):
        pred, true = _batch(seed, ties)
        torch.testing.assert_close(ndcg(pred, true, ats=ats), am.ndcg(pred, true, ats=ats))
        torch.testing.assert_close(
            ndcg(pred, true, ats=ats, gain_function=lambda x: x),
            am.ndcg(pred, true, ats=ats, gain_function=lambda x: x),
        )
        torch.testing.assert_close(mrr(pred, true, ats=ats), am.mrr(pred, true, ats=ats))


def test_no_relevant_conventions() -> None:
    _, am = load()
    pred, true = torch.tensor([[0.5, 0.2, 0.1]]), torch.tensor([[0.0, 0.0, PAD]])
    torch.testing.assert_close(ndcg(pred, true), am.ndcg(pred, true))  # filler_value 1.0
    assert float(ndcg(pred, true, filler_value=0.0)) == 0.0
    torch.testing.assert_close(mrr(pred, true), am.mrr(pred, true))  # 0


def test_allrank_metric_cases() -> None:
    """allRank's tests/losses/test_ndcg.py and test_mrr.py cases. Its test_ndcg_zero_when_no_relevant
    expects 0.0 from the default filler_value=1.0 and fails against allRank 1.4.3 itself (1.0): here
    the default gives allRank's 1.0 and filler_value=0.0 gives the 0.0 the test asks for."""

    def nd(p: list[float], t: list[float], ats: list[int] | None = None, **kw: float) -> torch.Tensor:
        return ndcg(torch.tensor([p]), torch.tensor([t]), ats=ats, **kw)

    assert float(nd([0.5, 0.2], [1.0, 0.0])) == 1.0
    assert float(nd([0.5, 0.2], [0.0, 1.0])) == pytest.approx(1 / math.log2(3))
    assert float(nd([0.5, 0.2], [0.0, 0.0], filler_value=0.0)) == 0.0
    assert float(nd([0.5, 0.2], [0.0, 0.0])) == 1.0
    assert nd([0.5, 0.2, 0.1], [1.0, 0.0, 1.0], ats=[1, 2])[0].tolist() == pytest.approx(
        [1.0, 1.0 / (1.0 + 1 / math.log2(3))]
    )
    assert float(nd([0.5, 0.2, 1.0], [1.0, 0.0, PAD])) == 1.0
    assert float(nd([0.5, 0.2, 1.0], [0.0, 1.0, PAD])) == pytest.approx(1 / math.log2(3))

    def rr(p: list[list[float]], t: list[list[float]], ats: list[int] | None = [10]) -> list[list[float]]:  # noqa: B006
        return mrr(torch.tensor(p), torch.tensor(t), ats=ats).tolist()

    assert rr([[0.5, 0.2]], [[1.0, 0.0]]) == [[1.0]]
    assert rr([[0.5, 0.2]], [[1.0, 0.0]], ats=None) == [[1.0]]
    assert rr([[0.5, 0.2]], [[0.0, 1.0]]) == [[0.5]]
    assert rr([[0.2, 0.5], [0.5, 0.2]], [[0.0, 1.0], [0.0, 1.0]]) == [[1.0], [0.5]]
    assert rr([[0.5, 0.2]], [[0.0, 1.0]], ats=[1, 2]) == [[0.0, 0.5]]
    assert rr([[0.2, 0.5], [0.5, 0.2]], [[0.0, 1.0], [0.0, 1.0]], ats=[1, 2]) == [[1.0, 1.0], [0.0, 0.5]]
    assert rr([[0.5, 0.2]], [[0.0, 0.0]]) == [[0.0]]
    assert rr([[0.5, 0.2, 1.0]], [[1.0, 0.0, PAD]]) == [[1.0]]
    assert rr([[0.5, 0.2, 1.0]], [[0.0, 1.0, PAD]]) == [[0.5]]


def test_map_at_k_full_list_is_sklearn_average_precision() -> None:
    for seed in range(8):
        pred, true = _batch(seed, ties=False)
        got = map_at_k(pred, true)[:, 0]
        for b in range(pred.shape[0]):
            keep = true[b] != PAD
            want = average_precision_score((true[b][keep] > 0).numpy(), pred[b][keep].numpy())
            assert float(got[b]) == pytest.approx(want, rel=1e-6)


def test_map_at_k_truncation_by_hand() -> None:
    pred = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5]])
    true = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
    # relevant at ranks 2, 3, 5: AP@3 = (1/2 + 2/3) / min(3, 3); AP@1 = 0; AP@5 = (1/2 + 2/3 + 3/5) / 3
    got = map_at_k(pred, true, ats=[1, 3, 5])[0].tolist()
    assert got == pytest.approx([0.0, (1 / 2 + 2 / 3) / 3, (1 / 2 + 2 / 3 + 3 / 5) / 3])
    assert map_at_k(pred, torch.zeros_like(true)).tolist() == [[0.0]]


@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (2, 0, 5), (2, 3, 0)])
def test_empty_lists_and_batches(shape: tuple[int, ...]) -> None:
    from rankwise.metrics import dcg

    p, t = torch.zeros(shape), torch.zeros(shape)
    for m in (dcg, ndcg, mrr, map_at_k):
        out = m(p, t)
        assert out.shape == (*shape[:-1], 1), (m.__name__, out.shape)


def test_nan_prediction_in_a_real_slot_gives_a_nan_row() -> None:
    from rankwise.metrics import dcg

    p = torch.tensor([[0.5, math.nan, 0.9, 0.1], [0.5, 0.2, 0.9, math.nan], [0.3, 0.2, 0.1, 0.0]])
    t = torch.tensor([[1.0, 0.0, 2.0, 0.0], [1.0, 0.0, 2.0, -1.0], [0.0, 1.0, 0.0, 0.0]])
    for m in (dcg, ndcg, mrr, map_at_k):
        out = m(p, t, ats=[1, 3])
        assert torch.isnan(out[0]).all(), m.__name__  # a NaN score has no rank
        clean = m(p[1:, :3], t[1:, :3], ats=[1, 3])  # a NaN in a padded slot is never read
        assert torch.equal(out[1:], clean), m.__name__


def test_a_real_item_scored_minus_inf_ranks_before_the_padding() -> None:
    from rankwise.metrics import dcg

    inf = math.inf
    p = torch.tensor([[1.0, -inf] + [0.0] * 30])
    t = torch.tensor([[0.0, 3.0] + [PAD] * 30])
    assert float(dcg(p, t)) == pytest.approx(7.0 / math.log2(3.0))  # 4.417: the grade 3 at rank 2
    # padding anywhere, and every metric: the list without its padding
    p = torch.tensor([[-inf, 0.5, 0.0, -3.0, 2.0, 0.0, 1.0], [0.3, 0.0, -inf, 0.0, 0.0, -2.0, 0.1]])
    t = torch.tensor([[2.0, 0.0, PAD, 1.0, 0.0, PAD, PAD], [PAD, PAD, 1.0, PAD, PAD, 0.0, 0.0]])
    for m in (dcg, ndcg, mrr, map_at_k):
        got = m(p, t, ats=[1, 2, 4])
        for row in range(2):
            keep = t[row] != PAD
            want = m(p[row : row + 1, keep], t[row : row + 1, keep], ats=[1, 2, 4])
            torch.testing.assert_close(got[row : row + 1], want, msg=f"{m.__name__} row {row}")
