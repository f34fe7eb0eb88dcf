"""Loss benchmarks: rankwise against re-implementations of the public reference code, side by side.

Usage::

    python benchmarks/losses.py                        # everything, 1 and 2 threads
    python benchmarks/losses.py --only supcon --threads 1 --supcon-batches 64,256
    python benchmarks/losses.py --markdown benchmarks/results/losses.json --only ranksim   # docs table

Every case is timed forward + backward on CPU, float32 (median over repeats; one repeat runs every
case of a group once, in a fresh random order, so that load from other jobs on a shared machine
hits all of them alike), for each ``--threads`` setting in the same process. Each printed line
gives the reference time, the rankwise time, their ratio (reference / rankwise: how many times
faster rankwise is), the thread count and the 1-minute load average; the JSON
(``benchmarks/results/losses.json``) holds everything plus the load averages before and after.

References (written from the public code's description, not copied):

* **SupCon**: HobbitLong's ``SupConLoss`` (``contrast_mode="all"``): views concatenated view-major,
  ``(B V) x (B V)`` logits divided by the temperature, minus the (detached) row maximum, the
  (B, B) label mask repeated to ``(B V) x (B V)``, the diagonal removed by a scattered
  ``logits_mask``, ``log_prob = logits - log(sum(exp(logits) * logits_mask))``, the mean of
  ``mask * log_prob`` over the positives, times ``-T / T_base``, averaged. The features are
  L2-normalized first (the public model normalizes its projection; ``supcon_loss`` does it by
  default). B x 2 views, D = 128, 100 classes, temperature 0.1.
* **RankSim**: the public ``batchwise_ranking_regularizer``: cosine similarities of the batch (one
  matmul), then a Python loop over rows: the label ranks and the feature ranks of the row by
  ``argsort().argsort()`` (normalized descending ranks), the feature ranks through the blackbox
  ``TrueRanker`` (backward: ranks of ``x + lambda * grad``), ``mse_loss`` summed over rows.
  Distinct labels (no subset is drawn), d = 512, lambda = 2. Also the *floor*: one B x B
  similarity matmul plus one row-wise ``torch.sort`` (forward and backward).
* **RnC**: the public ``RnCLoss``: two views concatenated, label differences (L1), feature
  similarities ``-||z_i - z_j||`` through a (N, N, D) difference tensor, divided by the
  temperature (2), minus the row maximum, the diagonal removed by ``masked_select``, then a loop
  over the N - 1 positive columns, each building its (N, N - 1) negative mask. 20 distinct labels.

SupCon peak memory (``--only supcon-memory``) is measured in fresh subprocesses at B = 4096 (see
``_memory_child``): the reference, ``supcon_loss`` (one block: the logits fit the budget) and
``supcon_loss(chunk_size=512)``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# the steady state of a training run: the numba kernels loaded before the first timed call (by
# default they load in the background and the calls before take the torch ops)
os.environ.setdefault("RANKWISE_NUMBA", "sync")
sys.path.insert(0, str(Path(__file__).parent))
from _tables import load_range, provenance, ratio, read
from _timing import fwd_bwd, loadavg, machine, peak_rss_growth, row, time_cases
from rankwise.losses import ranksim_loss, rnc_loss, supcon_loss

SECTIONS = ("supcon", "supcon-memory", "ranksim", "rnc")


# ---------------------------------------------------------------- references (from their descriptions)
def supcon_reference(
    features: torch.Tensor, labels: torch.Tensor, temperature: float = 0.1, base_temperature: float = 0.1
) -> torch.Tensor:
    """HobbitLong's SupConLoss (contrast_mode "all") on L2-normalized (B, V, D) features."""
    features = F.normalize(features, dim=-1)
    batch, views = features.shape[0], features.shape[1]
    same = torch.eq(labels.reshape(-1, 1), labels.reshape(1, -1)).float()
    contrast = torch.cat(torch.unbind(features, dim=1), dim=0)  # view-major (B V, D)
    dots = torch.div(contrast @ contrast.T, temperature)
    logits = dots - dots.max(dim=1, keepdim=True).values.detach()
    mask = same.repeat(views, views)
    n = batch * views
    logits_mask = torch.scatter(torch.ones_like(mask), 1, torch.arange(n, device=mask.device).view(-1, 1), 0)
    mask = mask * logits_mask
    exp_logits = torch.exp(logits) * logits_mask
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
    positives = mask.sum(1)
    positives = torch.where(positives < 1e-6, 1, positives)
    mean_log_prob_pos = (mask * log_prob).sum(1) / positives
    loss = -(temperature / base_temperature) * mean_log_prob_pos
    return loss.view(views, batch).mean()


def _rank_normalised(seq: torch.Tensor) -> torch.Tensor:
    """RankSim's normalized descending ranks (largest -> 1/n) by argsort of argsort."""
    return (torch.argsort(torch.argsort(seq, dim=-1, descending=True), dim=-1) + 1).float() / seq.shape[-1]


class _TrueRanker(torch.autograd.Function):
    """RankSim's blackbox ranker: ranks forward, -(r(x) - r(x + lambda g)) / lambda backward."""

    @staticmethod
    def forward(ctx: Any, sequence: torch.Tensor, lambda_val: float) -> torch.Tensor:  # type: ignore[override]
        rank = _rank_normalised(sequence)
        ctx.lambda_val = lambda_val
        ctx.save_for_backward(sequence, rank)
        return rank

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        sequence, rank = ctx.saved_tensors
        perturbed = _rank_normalised(sequence + ctx.lambda_val * grad_output)
        return -(rank - perturbed) / (ctx.lambda_val + 1e-8), None


def ranksim_reference(features: torch.Tensor, targets: torch.Tensor, lambda_val: float = 2.0) -> torch.Tensor:
    """RankSim's batchwise_ranking_regularizer for a batch of distinct labels (no subset drawn)."""
    x = F.normalize(features.view(features.shape[0], -1))
    xxt = x @ x.T
    y = targets.view(-1, 1)
    loss = features.new_zeros(())
    for i in range(y.shape[0]):
        label_ranks = _rank_normalised(-torch.abs(y[i] - y).transpose(0, 1))
        feature_ranks = _TrueRanker.apply(xxt[i].unsqueeze(0), lambda_val)
        loss = loss + F.mse_loss(feature_ranks, label_ranks)
    return loss


def ranksim_floor(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The floor: one similarity matmul plus one row-wise sort of the B x B matrix."""
    z = F.normalize(features.flatten(1), dim=1)
    return (torch.sort(z @ z.T, dim=1).values * weights).sum()


def rnc_reference(features: torch.Tensor, labels: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """The public RnCLoss (L1 label difference, L2 feature similarity) on (B, 2, D) features."""
    z = torch.cat([features[:, 0], features[:, 1]], dim=0)
    y = labels.reshape(labels.shape[0], -1).repeat(2, 1)
    label_diffs = torch.abs(y[:, None, :] - y[None, :, :]).sum(dim=-1)
    logits = -(z[:, None, :] - z[None, :, :]).norm(2, dim=-1) / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    exp_logits = logits.exp()
    n = logits.shape[0]
    off_diagonal = (1 - torch.eye(n, device=logits.device)).bool()
    logits = logits.masked_select(off_diagonal).view(n, n - 1)
    exp_logits = exp_logits.masked_select(off_diagonal).view(n, n - 1)
    label_diffs = label_diffs.masked_select(off_diagonal).view(n, n - 1)
    loss = z.new_zeros(())
    for k in range(n - 1):
        pos_logits = logits[:, k]
        neg_mask = (label_diffs >= label_diffs[:, k].view(-1, 1)).float()
        pos_log_probs = pos_logits - torch.log((neg_mask * exp_logits).sum(dim=-1))
        loss = loss - (pos_log_probs / (n * (n - 1))).sum()
    return loss


# ---------------------------------------------------------------- sections
def _supcon_inputs(b: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(b)
    return torch.randn(b, 2, 128, generator=g, requires_grad=True), torch.randint(0, 100, (b,), generator=g)


def _repeats_for(b: int, base: int) -> int:
    return max(3, min(base * 8, int(base * 256 / b)))


def bench_supcon(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in args.supcon_batches:
        x, y = _supcon_inputs(b)
        with torch.no_grad():
            agree = bool(torch.allclose(supcon_loss(x, y), supcon_reference(x, y), rtol=1e-4, atol=1e-5))
        cases = {
            "reference": fwd_bwd(lambda x=x, y=y: supcon_reference(x, y), x),
            "rankwise": fwd_bwd(lambda x=x, y=y: supcon_loss(x, y), x),
        }
        t = time_cases(cases, _repeats_for(b, args.repeats), budget_s=args.budget_s)
        ref, ours = t["reference"]["median_ms"], t["rankwise"]["median_ms"]
        print(row("supcon", f"B={b} V=2 D=128", threads, "reference", ref, ours), flush=True)
        out[f"B={b}"] = {"times": t, "values_agree": agree, "ratio": ref / ours, "loadavg": loadavg()}
        del x, y, cases
    out["target"] = "ratio >= 1.5 at every B from 64 to 8192, 1 and 2 threads"
    return out


def bench_ranksim(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in args.ranksim_batches:
        g = torch.Generator().manual_seed(b)
        x = torch.randn(b, 512, generator=g, requires_grad=True)
        y = torch.randperm(b, generator=g).float()  # distinct labels: the unique-label subset is the batch
        w = torch.randn(b, b, generator=g)
        with torch.no_grad():
            agree = bool(torch.allclose(ranksim_loss(x, y), ranksim_reference(x, y), rtol=1e-5, atol=1e-6))
        cases = {
            "rankwise": fwd_bwd(lambda x=x, y=y: ranksim_loss(x, y), x),
            "floor": fwd_bwd(lambda x=x, w=w: ranksim_floor(x, w), x),
        }
        t = time_cases(cases, _repeats_for(b, args.repeats), budget_s=args.budget_s)
        loops = args.loop_repeats if b <= 256 else 1
        t.update(time_cases({"reference": fwd_bwd(lambda x=x, y=y: ranksim_reference(x, y), x)}, loops, warmup=0))
        ours, floor, ref = (t[k]["median_ms"] for k in ("rankwise", "floor", "reference"))
        print(row("ranksim", f"B={b} d=512", threads, "reference", ref, ours), flush=True)
        print(f"ranksim   B={b} d=512        threads={threads}  rankwise / floor = {ours / floor:.2f} ({floor:.2f} ms)")
        out[f"B={b}"] = {
            "times": t,
            "values_agree": agree,
            "ratio_vs_reference": ref / ours,
            "ratio_to_floor": ours / floor,
            "loadavg": loadavg(),
        }
    out["target"] = "ratio_to_floor <= 2 at B = 256 and 1024"
    return out


def bench_rnc(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in args.rnc_batches:
        g = torch.Generator().manual_seed(b)
        x = torch.randn(b, 2, 128, generator=g, requires_grad=True)
        y = torch.randint(0, 20, (b,), generator=g).float()
        with torch.no_grad():
            agree = bool(torch.allclose(rnc_loss(x, y), rnc_reference(x, y), rtol=1e-4, atol=1e-5))
        t = time_cases({"rankwise": fwd_bwd(lambda x=x, y=y: rnc_loss(x, y), x)}, _repeats_for(b, args.repeats))
        t.update(
            time_cases({"reference": fwd_bwd(lambda x=x, y=y: rnc_reference(x, y), x)}, args.loop_repeats, warmup=0)
        )
        ref, ours = t["reference"]["median_ms"], t["rankwise"]["median_ms"]
        print(row("rnc", f"B={b} V=2 D=128", threads, "reference", ref, ours), flush=True)
        out[f"B={b}"] = {"times": t, "values_agree": agree, "ratio": ref / ours, "loadavg": loadavg()}
    out["target"] = "ratio >= 25 at B = 256"
    return out


# ---------------------------------------------------------------- SupCon memory (in a subprocess)
MEMORY_CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "reference": supcon_reference,
    "rankwise": lambda f, lab: supcon_loss(f, lab),
    "rankwise_chunk512": lambda f, lab: supcon_loss(f, lab, chunk_size=512),
}


def _memory_child(case: str, b: int) -> dict[str, Any]:
    """Peak RSS of one forward + backward above the RSS after a warm-up (``VmHWM - VmRSS``, after
    resetting the peak with ``echo 5 > /proc/self/clear_refs``), with ``MALLOC_MMAP_THRESHOLD_``
    set by the parent so that freed blocks go back to the OS and RSS follows live tensors; also
    the bytes autograd saves for backward."""
    fn = MEMORY_CASES[case]
    x, y = _supcon_inputs(b)
    fn(x[:64], y[:64]).backward()  # load kernels, allocate small buffers
    x.grad = torch.zeros_like(x)
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    def run() -> None:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(x, y)
        loss.backward()

    peak, _ = peak_rss_growth(run)
    return {"peak_rss_MiB": peak / 2**20, "saved_for_backward_MiB": saved / 2**20}


def bench_supcon_memory(args: argparse.Namespace) -> dict[str, Any]:
    b = 4096
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    mem = {}
    for case in MEMORY_CASES:
        cmd = [sys.executable, __file__, "--memory-child", case, "--threads", "1"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        mem[case] = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
    ratio = mem["rankwise_chunk512"]["peak_rss_MiB"] / mem["reference"]["peak_rss_MiB"]
    peaks = {case: round(m["peak_rss_MiB"]) for case, m in mem.items()}
    print(f"supcon    B={b} peak memory (MiB): {peaks} (chunked: {ratio:.3f} of the reference)", flush=True)
    return {"B": b, "memory": mem, "peak_ratio_chunked_over_reference": ratio, "target": "about 0.07"}


#: (section, ratio key, ratio against) of the docs tables
_TABLE_ROWS = (
    ("supcon", "ratio", "HobbitLong's `SupConLoss`", "SupCon, B = {b} (2 views, D = 128)"),
    ("ranksim", "ratio_vs_reference", "the public per-row loop", "RankSim, B = {b}, d = 512"),
    (
        "ranksim",
        "ratio_to_floor",
        "its floor (one B × B matmul + one row-wise `torch.sort`): rankwise / floor",
        "RankSim, B = {b}",
    ),
    ("rnc", "ratio", "the public O(N³) loop", "Rank-N-Contrast, B = {b} (2 views)"),
)


def markdown(result: dict[str, Any], sections: list[str] | None = None) -> str:
    """The docs table of a result: one row per loss and batch size, one ratio column per thread count."""
    secs = {k: v for k, v in result["sections"].items() if sections is None or k in sections}
    timed = {k: v for k, v in secs.items() if k != "supcon-memory"}
    threads = sorted({int(t.split("=")[1]) for v in timed.values() for t in v if t.startswith("threads=")})
    lines: list[str] = []
    if timed:
        head = " | ".join(f"{t} thread" + ("s" if t != 1 else "") for t in threads)
        lines += [
            "Ratio = the reference's time / rankwise's (above 1, rankwise is faster)"
            + ("; for the floor, rankwise's time / the floor's." if "ranksim" in timed else "."),
            "",
            f"| case | ratio against | {head} |",
            "|---|---|" + "---|" * len(threads),
        ]
        for name, key, against, label in _TABLE_ROWS:
            if name not in timed:
                continue
            sec = timed[name]
            batches = list(dict.fromkeys(b for t in threads for b in sec.get(f"threads={t}", {}) if b.startswith("B=")))
            for b in batches:
                cells = [ratio(sec.get(f"threads={t}", {}).get(b, {}).get(key)) for t in threads]
                lines.append(f"| {label.format(b=f'{int(b[2:]):,}')} | {against} | " + " | ".join(cells) + " |")
    if "supcon-memory" in secs:
        m = secs["supcon-memory"]
        mem = m["memory"]
        lines += [
            f"SupCon peak memory (resident set growth, MiB) at B = {m['B']:,}, 1 thread, each case in a fresh process:",
            "",
            "| reference | `supcon_loss` | `supcon_loss(chunk_size=512)` | chunked / reference |",
            "|---|---|---|---|",
            f"| {mem['reference']['peak_rss_MiB']:,.0f} | {mem['rankwise']['peak_rss_MiB']:,.0f} | "
            f"{mem['rankwise_chunk512']['peak_rss_MiB']:,.0f} | {m['peak_ratio_chunked_over_reference']:.3f} |",
        ]
    lines.append("")
    for name, sec in secs.items():
        loads = [sec.get("loadavg_start"), sec.get("loadavg_end")]
        loads += [
            c.get("loadavg")
            for t, v in sec.items()
            if t.startswith("threads=")
            for c in v.values()
            if isinstance(c, dict)
        ]
        ts = sorted(int(t.split("=")[1]) for t in sec if t.startswith("threads="))
        lines.append(
            f"{name}: "
            + provenance(
                "losses.py",
                commit=sec.get("commit", result.get("commit")),
                date=sec.get("date", result.get("date")),
                machine=sec,
                load=load_range(*loads),
                threads=" and ".join(map(str, ts)) if ts else "1",
            )
        )
    return "\n".join(lines).replace("\n\n\n", "\n\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    p.add_argument("--repeats", type=int, default=9, help="timed repeats at B = 256 (more for smaller B)")
    p.add_argument("--loop-repeats", type=int, default=3, help="repeats of the slow reference loops")
    p.add_argument("--budget-s", type=float, default=60.0, help="stop repeating a size after this long")
    p.add_argument("--supcon-batches", default="64,128,256,512,1024,2048,4096,8192")
    p.add_argument("--ranksim-batches", default="256,1024")
    p.add_argument("--rnc-batches", default="128,256")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "losses.json")
    p.add_argument("--memory-child", choices=list(MEMORY_CASES), help=argparse.SUPPRESS)
    p.add_argument(
        "--markdown", type=Path, default=None, help="print the docs table of this JSON (its --only sections)"
    )
    args = p.parse_args()
    if args.markdown is not None:
        print(markdown(read(args.markdown), args.only))
        return
    for name in ("supcon_batches", "ranksim_batches", "rnc_batches"):
        setattr(args, name, [int(v) for v in getattr(args, name).split(",") if v])
    thread_counts = [int(v) for v in args.threads.split(",")]
    if args.memory_child:
        torch.set_num_threads(1)
        print(json.dumps(_memory_child(args.memory_child, 4096)))
        return
    import random

    random.seed(args.seed)
    sections = args.only or list(SECTIONS)
    # sections run now replace their old results; the others are kept
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.setdefault("sections", {})
    benches = {"supcon": bench_supcon, "ranksim": bench_ranksim, "rnc": bench_rnc}
    for name in sections:
        entry: dict[str, Any] = {"device": "cpu", **machine(), "loadavg_start": loadavg()}
        if name == "supcon-memory":
            entry.update(bench_supcon_memory(args))
        else:
            for threads in thread_counts:
                torch.set_num_threads(threads)
                entry[f"threads={threads}"] = benches[name](args, threads)
        entry["loadavg_end"] = loadavg()
        result["sections"][name] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
