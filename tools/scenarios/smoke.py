"""The harness itself: a tiny run trains and its predictions reproduce from the same directory."""

from __future__ import annotations

from ._harness import Context, expect_success, scenario


@scenario
def train_then_evaluate(ctx: Context) -> tuple[str, str]:
    run = ctx.dir / "run"
    bad = expect_success(ctx.train("abalone_vanilla", "--out", run))
    if bad:
        return bad
    res = ctx.rankwise("evaluate", run, "--no-plots")
    return expect_success(res) or ("ok", res.tail(1))
