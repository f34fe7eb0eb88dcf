"""Hostile configs, flags, data files and checkpoints through the `rankwise` CLI, in subprocesses with timeouts.

Usage: PYTHONPATH=$PWD/src python tools/probe_cli.py OUT_DIR [WORKERS] [SECTIONS]

SECTIONS: comma-separated subset of cfg,set,flag,usage,data,ckpt,nifti (default: all). The summary and
every case go to OUT_DIR/results.json and benchmarks/results/probe_cli.json (env PROBE_JSON: elsewhere);
progress to OUT_DIR/progress.log. Each case runs in a child forked from this process (8 GiB address
space, 90 s).
Outcomes: ok (accepted as expected), clear (exactly one `error:` line, exit 2 / 130, no traceback, no
usage text), unclear (refused with exit 2 but with the command line parser's usage text or box instead
of one `error:` line), misleading (a clear error whose wording is not the one the case requires, e.g. a
corrupt checkpoint called a pickle payload), crash (traceback, "unexpected", other exit status, signal,
several error lines), hang (timeout), silent (exit 0 where a refusal is expected), false_refusal (clear
error where acceptance is expected).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

ALL_SECTIONS = "cfg,set,flag,usage,data,ckpt,nifti"
_ap = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0],
    epilog=__doc__.split("\n\n", 2)[2],
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
_ap.add_argument("out_dir", help="scratch folder (deleted and recreated)")
_ap.add_argument("workers", nargs="?", type=int, default=2, help="cases run at once (default 2)")
_ap.add_argument("sections", nargs="?", default=ALL_SECTIONS, help=f"comma-separated subset of {ALL_SECTIONS}")
_args = _ap.parse_args()
OUT = Path(_args.out_dir).resolve()
WORKERS = _args.workers
SECTIONS = set(_args.sections.split(","))
if not SECTIONS <= set(ALL_SECTIONS.split(",")):
    _ap.error(f"unknown section(s) {sorted(SECTIONS - set(ALL_SECTIONS.split(',')))}; choose from {ALL_SECTIONS}")
RESULTS = Path(
    os.environ.get("PROBE_JSON") or Path(__file__).resolve().parents[1] / "benchmarks/results/probe_cli.json"
)
SRC = os.environ["PYTHONPATH"]
shutil.rmtree(OUT, ignore_errors=True)
OUT.mkdir(parents=True)
F = OUT / "files"
F.mkdir()
TINY = [
    "model.options.hidden=[16]",
    "model.options.feature_dim=8",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.num_threads=1",
    "run.plots=false",
]


def sets(extra=()):
    return [a for s in [*TINY, *extra] for a in ("--set", s)]


cases: list[tuple[str, list[str], str]] = []  # (name, argv, expect: refuse | accept | either)
#: words the one error line of a case must hold (else the outcome is "misleading")
WORDING: dict[str, str] = {}
_n = [0]


def out_dir():
    _n[0] += 1
    return str(OUT / "runs" / f"r{_n[0]}")


def train(name, config, extra=(), expect="refuse", flags=()):
    cases.append((name, ["train", str(config), *sets(extra), "--out", out_dir(), "--no-progress", *flags], expect))


def write(name, text, mode="w"):
    p = F / name
    if mode == "wb":
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def bomb(width=10, levels=9, indent=""):
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- A. config files
(F / "folder").mkdir()
os.mkfifo(F / "fifo")
cfgs = {
    "alias_bomb": "extends: abalone_vanilla\ndata:\n  options:\n" + bomb(indent="    "),
    "alias_bomb_small_wide": "extends: abalone_vanilla\nx:\n" + bomb(1000, 3, "  "),
    "alias_bomb_merge": "extends: abalone_vanilla\nx:\n  a: &a {"
    + ", ".join(f"k{i}: [1,2,3,4,5,6,7,8,9,10]" for i in range(10))
    + "}\n"
    + "".join(f"  b{i}: &b{i} [{', '.join(['*a' if i == 0 else f'*b{i - 1}'] * 10)}]\n" for i in range(6)),
    "deep_5000_flow": "extends: abalone_vanilla\nx: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep_5000_map": "extends: abalone_vanilla\nx: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
    "deep_65": "extends: abalone_vanilla\nx: " + "[" * 65 + "]" * 65 + "\n",
    "deep_block_200": "extends: abalone_vanilla\n"
    + "".join("  " * i + "a:\n" for i in range(200))
    + "  " * 200
    + "a: 1\n",
    "recursive_alias": "extends: abalone_vanilla\nx: &a [*a]\n",
    "recursive_map": "extends: abalone_vanilla\nx: &a {y: *a}\n",
    "empty": "",
    "comments_only": "# nothing\n# at all\n",
    "null_doc": "null\n",
    "list_doc": "- 1\n- 2\n",
    "scalar_doc": "hello\n",
    "multi_doc": "recipe: dir\n---\nrecipe: sort\n",
    "python_object": "recipe: !!python/object/apply:os.system ['touch " + str(OUT / "PWNED") + "']\n",
    "python_name": "recipe: !!python/name:os.system\n",
    "binary_tag": "recipe: !!binary aGVsbG8=\n",
    "set_tag": "recipe: !!set {a, b}\n",
    "timestamp_seed": "extends: abalone_vanilla\nrun:\n  seed: 2001-12-14\n",
    "unclosed_bracket": "recipe: [dir\n",
    "bad_indent": "recipe: dir\n  data: x\n",
    "tab_indent": "recipe: dir\ndata:\n\tname: abalone\n",
    "dup_keys": "recipe: dir\nrecipe: sort\n",
    "int_key": "extends: abalone_vanilla\n1: 2\n",
    "null_key": "extends: abalone_vanilla\n~: 2\n",
    "list_key": "extends: abalone_vanilla\n? [a, b]\n: 1\n",
    "unknown_key": "extends: abalone_vanilla\ndatas: {}\n",
    "unknown_nested": "extends: abalone_vanilla\ntrainer:\n  max_epoch: 3\n",
    "section_scalar": "extends: abalone_vanilla\ntrainer: 3\n",
    "section_list": "extends: abalone_vanilla\ntrainer: [1, 2]\n",
    "task_scalar": "extends: abalone_vanilla\ntask: 5\n",
    "recipe_int": "recipe: 5\n",
    "recipe_bogus": "recipe: bogus\n",
    "extends_missing": "extends: nope.yaml\n",
    "extends_folder": "extends: folder\n",
    "extends_devzero": "extends: /dev/zero\n",
    "extends_fifo": "extends: fifo\n",
    "extends_self": "extends: extends_self.yaml\n",
    "extends_int": "extends: 5\n",
    "extends_list": "extends: [a, b]\n",
    "extends_empty_str": "extends: ''\n",
    "extends_bogus_preset": "extends: abalone_vanila\n",
    "extends_etc_passwd": "extends: /etc/passwd\n",
    "extends_binary": "extends: /bin/ls\n",
    "huge_string": "extends: abalone_vanilla\ndescription: '" + "x" * 2_000_000 + "'\n",
    "lr_string_abc": "extends: abalone_vanilla\noptimizer:\n  lr: abc\n",
    "lr_string_underscore": "extends: abalone_vanilla\noptimizer:\n  lr: '1_0'\n",
    "lr_string_nan": "extends: abalone_vanilla\noptimizer:\n  lr: 'nan'\n",
    "lr_yaml_nan": "extends: abalone_vanilla\noptimizer:\n  lr: .nan\n",
    "lr_yaml_inf": "extends: abalone_vanilla\noptimizer:\n  lr: .inf\n",
    "epochs_string": "extends: abalone_vanilla\ntrainer:\n  max_epochs: '3'\n",
    "epochs_float": "extends: abalone_vanilla\ntrainer:\n  max_epochs: 2.5\n",
    "epochs_huge": "extends: abalone_vanilla\ntrainer:\n  max_epochs: 100000000000000000000000\n",
    "seed_negative": "extends: abalone_vanilla\nrun:\n  seed: -1\n",
    "seed_2_32": "extends: abalone_vanilla\nrun:\n  seed: 4294967296\n",
    "run_name_dotdot": "extends: abalone_vanilla\nrun:\n  name: '..'\n",
    "run_name_slash": "extends: abalone_vanilla\nrun:\n  name: a/b\n",
    "sinkhorn_eps_neg": "extends: large_mnist_sinkhorn\ntask:\n  options:\n    epsilon: -1\n",
    "sinkhorn_eps_str": "extends: large_mnist_sinkhorn\ntask:\n  options:\n    epsilon: abc\n",
    "sinkhorn_iter_neg": "extends: large_mnist_sinkhorn\ntask:\n  options:\n    max_iter: -5\n",
    "sinkhorn_unknown": "extends: large_mnist_sinkhorn\ntask:\n  options:\n    epsilonn: 0.1\n",
}
(F / "latin1.yaml").write_bytes("recipe: dir\ndescription: caf\xe9\n".encode("latin-1"))
(F / "utf16.yaml").write_bytes("recipe: dir\n".encode("utf-16"))
(F / "bom.yaml").write_bytes(b"\xef\xbb\xbfextends: abalone_vanilla\n")
(F / "nul.yaml").write_bytes(b"recipe: dir\x00\n")
(F / "zip.yaml").write_bytes(b"PK\x03\x04" + os.urandom(200))
(F / "random.yaml").write_bytes(np.random.default_rng(0).bytes(5000))
with open(F / "sparse.yaml", "wb") as fh:
    fh.truncate(5 * 2**30)
for name, text in cfgs.items():
    write(f"{name}.yaml", text)
for name in cfgs:
    if name in ("epochs_string", "epochs_float", "section_scalar"):
        # TINY's --set trainer.max_epochs would replace the file's bad value (a --set wins): leave it out
        cases.append(
            (
                f"cfg:{name}",
                [
                    "train",
                    str(F / f"{name}.yaml"),
                    *[a for t in TINY if not t.startswith("trainer.max_epochs") for a in ("--set", t)],
                    "--out",
                    out_dir(),
                    "--no-progress",
                ],
                "refuse",
            )
        )
    elif name == "epochs_huge":  # a valid int (train long); TINY's max_epochs=2 replaces it
        train(f"cfg:{name}", F / f"{name}.yaml", expect="either")
    else:
        train(f"cfg:{name}", F / f"{name}.yaml")
for name in ("latin1", "utf16", "nul", "zip", "random", "sparse"):
    train(f"cfg:{name}", F / f"{name}.yaml")
train("cfg:bom (valid)", F / "bom.yaml", expect="accept")
(F / "symlink_loop.yaml").symlink_to(F / "symlink_loop.yaml")
train("cfg:symlink_loop", F / "symlink_loop.yaml")
train("cfg:directory", F / "folder")
train("cfg:devzero", "/dev/zero")
train("cfg:fifo", F / "fifo")
train("cfg:missing", F / "missing.yaml")

# ---------------------------------------------------------------- B. --set values
numeric_fields = [
    "data.batch_size",
    "data.eval_batch_size",
    "data.num_workers",
    "optimizer.lr",
    "optimizer.weight_decay",
    "optimizer.momentum",
    "schedule.gamma",
    "schedule.warmup_epochs",
    "trainer.max_epochs",
    "trainer.num_nodes",
    "trainer.log_every_n_steps",
    "trainer.num_threads",
    "run.seed",
    "run.plot_samples",
    "run.many_shot",
    "loss.lds.ks",
    "loss.lds.sigma",
    "loss.fds.momentum",
]
hostile_values = ["-1", "abc", "[1,2]", "{a: 1}", "true", ".nan", "1e999", '"1_0"']
for f in numeric_fields:
    for v in hostile_values:
        train(f"set:{f}={v}", "abalone_vanilla", [f"{f}={v}"])
for s in [
    "optimizer.name=bogus",
    "trainer.precision=bogus",
    "trainer.accelerator=bogus",
    "trainer.strategy=bogus",
    "trainer.devices=[-1]",
    "trainer.devices=abc",
    "trainer.devices=[]",
    "loss.kind=bogus",
    "model.backbone=bogus",
    "data.name=bogus",
    "recipe=bogus",
    "run.name=../x",
    'run.name=""',
    "run.out_dir=[1]",
    "model.options.hidden=-3",
    "model.options.hidden=[abc]",
    "model.options.hidden=[100000000000]",
    "model.options.hidden=[0]",
    "model.options.bogus=1",
    "model.weights=/etc/passwd",
    "model.weights=/dev/zero",
    "model.weights=/nonexistent.pt",
    f"model.weights={F}",
    "data.options.per_label=abc",
    "data.options.per_label=-1",
    "data.options.path=/etc/shadow",
    "data.options.path=/dev/zero",
    "data.options.bogus=1",
    "loss.regularizers.ranksim.weight=-1",
    "loss.regularizers.ranksim.options.bogus=1",
    "loss.regularizers.bogus.weight=1",
    "loss.regularizers.ranksim.options.interpolation_lambda=abc",
    "schedule.milestones=[3,1]",
    "schedule.kind=bogus",
    "trainer.limit_train_batches=-1",
    "trainer.limit_train_batches=abc",
    "trainer.limit_train_batches=0",
    "trainer.deterministic=abc",
    "run.few_shot=500",
    "loss.lds.ks=4",
    "loss.lds.lds=true",
    "data.x=" + "{" + bomb().strip().replace("\n", ", ") + "}",
    "data.options.x=" + "[" * 3000 + "]" * 3000,
    "noequals",
    "=1",
    "a..b=1",
    "trainer.max_epochs.x=1",
]:
    train(f"set:{s[:60]}", "abalone_vanilla", [s])

# ---------------------------------------------------------------- C. flags
for d in ["0,,x", "abc", "-5", "0,-1", ",", "1.5"]:
    train(f"flag:--devices {d}", "abalone_vanilla", flags=["--devices", d])
for flag, v in [
    ("--precision", "bogus"),
    ("--accelerator", "bogus"),
    ("--num-nodes", "0"),
    ("--num-nodes", "-1"),
    ("--strategy", "bogus"),
]:
    train(f"flag:{flag} {v}", "abalone_vanilla", flags=[flag, v])
cases.append(
    (
        "flag:--resume --overwrite on a fresh dir",
        ["train", "abalone_vanilla", "--resume", "--overwrite", "--out", out_dir()],
        "refuse",
    )
)
cases.append(
    ("flag:--resume without a run dir", ["train", "abalone_vanilla", "--resume", "--out", out_dir()], "refuse")
)
for seeds in ["a", "3-1", "-1", "", "1,,x", "0-100000000000"]:
    cases.append(
        (
            f"flag:compare --seeds {seeds!r}",
            ["compare", "abalone_vanilla", "--seeds", seeds, "--out", out_dir()],
            "refuse",
        )
    )
cases.append(("flag:evaluate --checkpoint bogus", ["evaluate", str(F), "--checkpoint", "bogus"], "refuse"))
cases.append(("flag:evaluate missing dir", ["evaluate", str(F / "nope")], "refuse"))
cases.append(("flag:evaluate a file", ["evaluate", "/etc/passwd"], "refuse"))
cases.append(("flag:evaluate a non-run dir", ["evaluate", str(F)], "refuse"))
cases.append(("flag:predict missing dir", ["predict", str(F / "nope"), "--data", str(F / "new.csv")], "refuse"))
cases.append(("flag:predict a file as run dir", ["predict", "/etc/passwd", "--data", "/etc/passwd"], "refuse"))
cases.append(("flag:predict a non-run dir", ["predict", str(F), "--data", str(F / "new.csv")], "refuse"))
cases.append(("flag:predict without --data", ["predict", str(F)], "refuse"))
for o in [
    "noeq",
    "path=[unclosed",
    "path=!!python/object:os.system x",
    "per_label=-1",
    "per_label=abc",
    "bogus=1",
    "path=/etc/shadow",
    "path=/dev/zero",
    "path=" + "[" * 3000,
]:
    cases.append((f"flag:data show -O {o[:40]}", ["data", "show", "abalone", "-O", o], "refuse"))
cases.append(("flag:data show bogus", ["data", "show", "bogus"], "refuse"))
(F / "plotdir").mkdir()
for p, exp in [
    (F / "nope" / "h.png", "refuse"),
    ("/proc/h.png", "refuse"),
    (F / "plotdir", "refuse"),
    (F / "h.txt", "refuse"),
    (F / "hist", "accept"),
    (F / "nope" / "full", "refuse"),
]:
    cases.append((f"flag:data show --plot {p}", ["data", "show", "abalone", "--plot", str(p)], exp))
for args in [
    ["--seq-len", "0"],
    ["--seq-len", "-1"],
    ["--model", "bogus"],
    ["--steps", "0"],
    ["--batch-size", "0"],
    ["--lr", "-1"],
    ["--hidden-size", "0"],
    ["--num-layers", "-1"],
    ["--eval-num", "0"],
    ["--threads", "0"],
    ["--lr", "nan"],
]:
    extra = [] if "--steps" in args else ["--steps", "1"]
    cases.append(
        (
            f"flag:sodeep train {' '.join(args)}",
            ["sodeep", "train", *args, *extra, "--out", out_dir(), "--no-progress"],
            "refuse",
        )
    )
for args in [
    ["--weights", "/etc/passwd"],
    ["--weights", "/dev/zero"],
    ["--weights", str(F / "nope.pt")],
    ["--weights", str(F)],
    ["--seq-len", "7"],
    ["--num", "0"],
    ["--model", "bogus"],
]:
    cases.append((f"flag:sodeep evaluate {' '.join(args)}", ["sodeep", "evaluate", *args, "--no-real"], "refuse"))


# ---------------------------------------------------------------- C2. usage errors of the command line parser
def _command_paths() -> list[tuple[tuple[str, ...], object]]:
    import typer

    from rankwise.cli import app

    def walk(cmd, path):
        out = [(path, cmd)] if path else []
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            out += walk(sub, (*path, name))
        return out

    return walk(typer.main.get_command(app), ())


def _required_but(required: list, skip: object) -> list[str]:
    """The required parameters other than ``skip``, filled (positionals first, as typed)."""
    pos = ["x" for o in required if o is not skip and not o.opts[0].startswith("--")]
    opts = [a for o in required if o is not skip and o.opts[0].startswith("--") for a in (o.opts[0], "x")]
    return pos + opts


for path, cmd in _command_paths():
    p = list(path)
    cases.append((f"usage:{' '.join(p)} --no-such-flag", [*p, "--no-such-flag"], "refuse"))
    WORDING[f"usage:{' '.join(p)} --no-such-flag"] = "--no-such-flag"
    if hasattr(cmd, "commands"):
        cases.append((f"usage:{' '.join(p)} bogus-command", [*p, "bogus-command"], "refuse"))
        WORDING[f"usage:{' '.join(p)} bogus-command"] = "bogus-command"
        continue
    params = [q for q in cmd.params if q.name != "help"]
    required = [q for q in params if q.required]

    for q in required:  # the command without one required argument/option, the others given
        if q.opts[0].startswith("--"):
            cases.append((f"usage:{' '.join(p)} without {q.opts[0]}", [*p, *_required_but(required, q)], "refuse"))
            WORDING[f"usage:{' '.join(p)} without {q.opts[0]}"] = q.opts[0]
        else:
            cases.append((f"usage:{' '.join(p)} without {q.name}", [*p, *_required_but(required, q)], "refuse"))
            WORDING[f"usage:{' '.join(p)} without {q.name}"] = q.name
    fill = [a for q in required if q.opts[0].startswith("--") for a in (q.opts[0], str(OUT / "usage_out"))]
    fill += ["x"] * sum(1 for q in required if not q.opts[0].startswith("--"))
    for q in params:
        opt = q.opts[0]
        if not opt.startswith("-") or getattr(q, "is_flag", False) or opt in ("--out",):
            continue
        kind = getattr(getattr(q, "type_descriptor", None), "annotation", None)
        for v in ("abc", "1.5", "") if kind in (int, float) else ():
            if v == "1.5" and kind is float:
                continue
            name = f"usage:{' '.join(p)} {opt} {v!r}"
            cases.append((name, [*p, *fill, opt, v], "refuse"))
            WORDING[name] = opt
        name = f"usage:{' '.join(p)} {opt} without a value"
        cases.append((name, [*p, *fill, opt], "refuse"))
        WORDING[name] = opt
for command, bad_values in {
    "ltr-synthetic": {
        "--seed": ["-1"],
        "--train-queries": ["-3", "0", "100000000"],
        "--val-queries": ["0", "-1"],
        "--test-queries": ["0", "-1"],
        "--num-features": ["0", "1000000000"],
        "--informative": ["0", "47"],
    },
    "brain-age-synthetic": {
        "--n": ["0", "-1"],
        "--spacing": ["0", "nan", "inf", "-2", "9"],
        "--seed": ["-1"],
        "--sites": ["0", "-2"],
    },
}.items():
    for opt, values in bad_values.items():
        for v in values:
            name = f"usage:data make {command} {opt} {v}"
            argv = ["data", "make", command, "--out", str(OUT / "make_out" / name[-40:]), opt, v]
            cases.append((name, argv, "refuse"))
            WORDING[name] = opt

# ---------------------------------------------------------------- D. data files (data show csv, and train for targets)
rng = np.random.default_rng(0)


def table(n=200, cols=2, target_scale=1.0):
    x = rng.random((n, cols))
    rows = [",".join([f"x{i}" for i in range(cols)] + ["y"])]
    rows += [",".join([f"{v:.4f}" for v in r] + [f"{target_scale * (r[0] * 10):.6e}"]) for r in x]
    return rows


datafiles = {}
rows = table()
datafiles["valid"] = "\n".join(rows) + "\n"
bad = list(rows)
bad[50] = '"0.1,2'
datafiles["unterminated_quote"] = "\n".join(bad) + "\n"
bad = list(rows)
bad[50] = '"0.1"x,2'
datafiles["text_after_quote"] = "\n".join(bad) + "\n"
bad = list(rows)
bad[50] = "0.1,nan,3"
datafiles["extra_field"] = "\n".join(bad) + "\n"
for tag, val in [
    ("nan", "nan"),
    ("inf", "inf"),
    ("1e39", "1e39"),
    ("empty", ""),
    ("text", "abc"),
    ("under", "1_0"),
    ("hex", "0x10"),
    ("arabic_digit", "\u0661"),
]:
    bad = list(rows)
    bad[60] = f"0.5,0.5,{val}"
    datafiles[f"value_{tag}"] = "\n".join(bad) + "\n"
datafiles["empty"] = ""
datafiles["header_only"] = rows[0] + "\n"
datafiles["dup_columns"] = "x,x,y\n" + "\n".join(rows[1:]) + "\n"
datafiles["empty_column_name"] = "x,,y\n" + "\n".join(rows[1:]) + "\n"
datafiles["no_target"] = "a,b\n1,2\n"
datafiles["three_rows"] = "\n".join(rows[:4]) + "\n"
datafiles["million_columns"] = ",".join(f"c{i}" for i in range(10**6)) + ",y\n" + ",".join(["1"] * (10**6 + 1)) + "\n"
datafiles["100001_columns"] = ",".join(f"c{i}" for i in range(100_001)) + ",y\n"
datafiles["long_field"] = "x,y\n" + "1" * 200_000 + ",2\n"
datafiles["secret"] = "root:$6$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"
datafiles["targets_3e38"] = "\n".join(table(target_scale=3e37)) + "\n"
datafiles["targets_-3e38"] = "\n".join(table(target_scale=-3e37)) + "\n"
datafiles["targets_1e20"] = "\n".join(table(target_scale=1e20)) + "\n"
for name, text in datafiles.items():
    write(f"{name}.csv", text)
(F / "latin1.csv").write_bytes("x,y\n1,caf\xe9\n".encode("latin-1"))
(F / "utf16.csv").write_bytes(datafiles["valid"].encode("utf-16"))
(F / "nul.csv").write_bytes(b"x,y\n1,\x002\n")
with gzip.open(F / "bomb.csv.gz", "wb", compresslevel=9) as fh:
    fh.write(b"x,y\n")
    chunk = b"1,2\n" * 2**20
    for _ in range(300):
        fh.write(chunk)
(F / "truncated.csv.gz").write_bytes(gzip.compress(datafiles["valid"].encode())[:100])
(F / "notgzip.csv.gz").write_bytes(b"x,y\n1,2\n")
with zipfile.ZipFile(F / "good.zip", "w", zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("d.csv", datafiles["valid"])
(F / "truncated.zip").write_bytes((F / "good.zip").read_bytes()[:300])
with zipfile.ZipFile(F / "two.zip", "w") as zf:
    zf.writestr("a.csv", "x,y\n")
    zf.writestr("b.csv", "x,y\n")
with zipfile.ZipFile(F / "zipbomb.zip", "w", zipfile.ZIP_DEFLATED) as zf:
    with zf.open("d.csv", "w", force_zip64=True) as fh:
        fh.write(b"x,y\n")
        for _ in range(300):
            fh.write(chunk)
with open(F / "sparse.csv", "wb") as fh:
    fh.truncate(20 * 2**30)
(F / "link_loop.csv").symlink_to(F / "link_loop.csv")
for name in [*datafiles, "latin1", "utf16", "nul"]:
    p = F / f"{name}.csv"
    exp = "accept" if name in ("valid", "targets_3e38", "targets_-3e38", "targets_1e20") else "refuse"
    cases.append((f"data:{name}", ["data", "show", "csv", "-O", f"path={p}", "-O", "target=y"], exp))
for name in [
    "bomb.csv.gz",
    "truncated.csv.gz",
    "notgzip.csv.gz",
    "good.zip",
    "truncated.zip",
    "two.zip",
    "zipbomb.zip",
    "sparse.csv",
    "link_loop.csv",
    "folder",
    "fifo",
    "nope.csv",
]:
    p = F / name
    cases.append(
        (
            f"data:{name}",
            ["data", "show", "csv", "-O", f"path={p}", "-O", "target=y"],
            "accept" if name == "good.zip" else "refuse",
        )
    )
cases.append(("data:/dev/zero", ["data", "show", "csv", "-O", "path=/dev/zero", "-O", "target=y"], "refuse"))
for name in ["targets_3e38", "targets_-3e38", "targets_1e20", "unterminated_quote", "secret"]:
    train(
        f"data-train:{name}",
        "abalone_vanilla",
        ["data.name=csv", f"data.options={{path: {F / (name + '.csv')}, target: y}}"],
    )
train(
    "data-train:valid",
    "abalone_vanilla",
    ["data.name=csv", f"data.options={{path: {F / 'valid.csv'}, target: y}}"],
    expect="accept",
)


# ---------------------------------------------------------------- E. NIfTI cohorts (data show nifti, data make)
def nifti_cases():
    import nibabel as nib

    N = F / "nifti"
    N.mkdir()
    rng2 = np.random.default_rng(2)

    def vol(shape=(12, 14, 12), scale=100.0):
        v = np.zeros(shape, np.float32)
        v[2:-2, 2:-2, 2:-2] = scale * (1.0 + rng2.random(tuple(max(s - 4, 1) for s in shape[:3])))
        return v

    def save(name, data, affine=None, gz=False):
        path = N / (name + (".nii.gz" if gz else ".nii"))
        nib.save(nib.Nifti1Image(data, np.eye(4) if affine is None else affine), str(path))
        return path

    good = [save(f"s{i}", vol()) for i in range(12)]
    good.append(save("gz", vol(), gz=True))

    def cohort(name, rows, header="path,age,sex,subject"):
        path = N / f"{name}.csv"
        path.write_text(header + "\n" + "\n".join(rows) + "\n")
        return path

    base = [f"{g.name},{30 + 3 * i},{'MF'[i % 2]},sub{i}" for i, g in enumerate(good)]
    out = []

    def show(name, csv_path, expect="refuse", opts=()):
        args = ["data", "show", "nifti", "-O", f"csv={csv_path}", "-O", f"cache_dir={N / 'cache'}", *opts]
        out.append((f"nifti:{name}", list(args), expect))

    show("valid", cohort("valid", base), "accept")
    show("valid_shape", cohort("valid2", base), "accept", ["-O", "shape=[8,8,8]"])
    bad_vols = {
        "nan_voxel": lambda: (lambda v: (v.__setitem__((5, 5, 5), np.nan), v)[1])(vol()),
        "inf_voxel": lambda: (lambda v: (v.__setitem__((5, 5, 5), np.inf), v)[1])(vol()),
        "vol_2d": lambda: vol()[:, :, 0],
        "vol_4d": lambda: np.stack([vol(), vol()], -1),
        "vol_5d": lambda: vol()[..., None, None],
        "wrong_shape": lambda: vol((10, 10, 10)),
        "all_zero": lambda: np.zeros((12, 14, 12), np.float32),
        "huge_values": lambda: vol(scale=1e30),
        "tiny_values": lambda: vol(scale=1e-30),
        "values_1e5": lambda: vol(scale=1e5),
        "int16": lambda: vol().astype(np.int16),
        "uint8": lambda: vol(scale=50).astype(np.uint8),
        "float64": lambda: vol().astype(np.float64),
        "complex": lambda: vol().astype(np.complex64),
        "bool": lambda: vol() > 0,
        "one_voxel": lambda: np.ones((1, 1, 1), np.float32),
    }
    for tag, make in bad_vols.items():
        try:
            path = save(tag, make())
        except Exception as e:  # nibabel refuses to write some dtypes
            print("skip", tag, e)
            continue
        rows = [*base[:-1], f"{path.name},50,M,bad"]
        expect = (
            "accept"
            if tag in ("values_1e5", "int16", "uint8", "float64", "all_zero", "huge_values", "tiny_values")
            else "refuse"
        )  # brain_zscore rescales huge/tiny volumes
        show(tag, cohort(f"c_{tag}", rows), expect)
    for tag, affine in {
        "affine_nan": np.full((4, 4), np.nan),
        "affine_zero": np.zeros((4, 4)),
        "affine_neg": np.diag([-2.0, 2.0, 2.0, 1.0]),
        "affine_huge": np.diag([1e30, 1e30, 1e30, 1.0]),
    }.items():
        try:
            path = save(tag, vol(), affine=affine)
        except Exception as e:  # nibabel refuses to write some affines
            print("skip", tag, type(e).__name__)
            continue
        rows = [*base[:-1], f"{path.name},50,M,bad"]
        show(tag, cohort(f"c_{tag}", rows), "either")
        show(tag + "_spacing", cohort(f"c_{tag}_sp", rows), "either", ["-O", "spacing=4", "-O", "shape=[6,6,6]"])
    raw = good[0].read_bytes()
    gzraw = good[-1].read_bytes()
    for tag, data in {
        "truncated": raw[:400],
        "truncated_data": raw[:-500],
        "truncated_gz": gzraw[: len(gzraw) // 2],
        "empty": b"",
        "text": b"hello\n",
        "random": rng2.bytes(2000),
        "header_dims_huge": None,
        "header_dims_zero": None,
        "header_dims_neg": None,
        "header_pixdim_nan": None,
        "header_pixdim_zero": None,
        "header_datatype_bogus": None,
    }.items():
        name = tag + (".nii.gz" if tag == "truncated_gz" else ".nii")
        path = N / name
        if data is None:
            hdr = bytearray(raw)
            import struct

            if tag.startswith("header_dims"):
                dims = {
                    "header_dims_huge": (3, 30000, 30000, 30000),
                    "header_dims_zero": (3, 0, 14, 12),
                    "header_dims_neg": (3, -12, 14, 12),
                }[tag]
                struct.pack_into("<4h", hdr, 40, *dims)
            elif tag == "header_datatype_bogus":
                struct.pack_into("<2h", hdr, 70, 999, 7)
            else:
                v = float("nan") if tag.endswith("nan") else 0.0
                struct.pack_into("<3f", hdr, 80, v, v, v)
                struct.pack_into("<2h", hdr, 252, 0, 0)  # no qform/sform: the affine comes from pixdim
            data = bytes(hdr)
        path.write_bytes(data)
        show(
            tag,
            cohort(f"c_{tag}", [*base[:-1], f"{name},50,M,bad"]),
            "either" if tag == "header_pixdim_zero" else "refuse",
        )  # nibabel reads 0 voxel sizes as 1 (warns)
    big = N / "sparse.nii"
    with open(big, "wb") as fh:
        fh.write(raw[:352])
        fh.truncate(8 * 2**30)
    show("sparse_8GiB", cohort("c_sparse", [*base[:-1], "sparse.nii,50,M,bad"]))
    for tag, row in {
        "age_neg": "s0.nii,-3,M,x",
        "age_text": "s0.nii,abc,M,x",
        "age_nan": "s0.nii,nan,M,x",
        "age_inf": "s0.nii,inf,M,x",
        "age_1e400": "s0.nii,1e400,M,x",
        "age_empty": "s0.nii,,M,x",
        "age_huge": "s0.nii,1e30,M,x",
        "sex_bogus": "s0.nii,40,X,x",
        "sex_2": "s0.nii,40,2,x",
        "path_empty": ",40,M,x",
        "path_missing": "nope.nii,40,M,x",
        "path_dir": ".,40,M,x",
        "path_etc_shadow": "/etc/shadow,40,M,x",
        "path_devzero": "/dev/zero,40,M,x",
        "path_csv_itself": "c_path_csv_itself.csv,40,M,x",
        "extra_field": "s0.nii,40,M,x,extra",
        "short_row": "s0.nii",
    }.items():
        show(tag, cohort(f"c_{tag}", [*base[:-1], row]))
    show("no_rows", cohort("c_no_rows", []))
    show("no_age_column", cohort("c_noage", [f"{g.name}" for g in good], header="path"))
    show(
        "header_only_path_age",
        cohort("c_min", [f"{g.name},{40 + i}" for i, g in enumerate(good)], "path,age"),
        "accept",
    )
    show("one_subject", cohort("c_one", [base[0]]), "either")
    split_rows = [f"{g.name},{30 + i},M,sub{i},{['train', 'val', 'test'][i % 3]}" for i, g in enumerate(good)]
    show("split_valid", cohort("c_split", split_rows, "path,age,sex,subject,split"), "accept")
    show(
        "split_bogus",
        cohort("c_split_bogus", [*split_rows[:-1], f"{good[-1].name},40,M,z,bogus"], "path,age,sex,subject,split"),
    )
    show(
        "split_subject_two",
        cohort("c_split_two", [*split_rows, f"{good[0].name},40,M,sub1,test"], "path,age,sex,subject,split"),
    )
    show(
        "split_partial",
        cohort("c_split_part", [*split_rows[:-1], f"{good[-1].name},40,M,z,"], "path,age,sex,subject,split"),
    )
    show(
        "split_no_train",
        cohort(
            "c_split_notrain",
            [f"{g.name},{30 + i},M,sub{i},test" for i, g in enumerate(good)],
            "path,age,sex,subject,split",
        ),
    )
    (N / "latin1.csv").write_bytes(("path,age\n" + "\n".join(f"{g.name},4\xe9" for g in good) + "\n").encode("latin-1"))
    show("csv_latin1", N / "latin1.csv")
    show("csv_missing", N / "nope.csv")
    show("csv_dir", N)
    show("csv_devzero", "/dev/zero")
    for o in [
        "shape=[0,8,8]",
        "shape=[8,8]",
        "shape=abc",
        "shape=[8.5,8,8]",
        "shape=[100000,100000,100000]",
        "spacing=0",
        "spacing=-2",
        "spacing=abc",
        "spacing=.nan",
        "spacing=1e-3",
        "resize=bogus",
        "normalize=bogus",
        "val_fraction=1.5",
        "test_fraction=-0.1",
        "seed=abc",
        "augment=abc",
        "bogus=1",
        "cache_dir=/proc/x",
        "cache_dir=/etc/passwd",
    ]:
        show(f"opt:{o[:30]}", cohort("c_opt", base), opts=["-O", o])
    for args in [
        ["--n", "0"],
        ["--n", "-1"],
        ["--spacing", "0"],
        ["--spacing", "-1"],
        ["--spacing", "nan"],
        ["--spacing", "0.05"],
        ["--sites", "0"],
        ["--n", "2", "--out", "/proc/x"],
        ["--n", "2", "--out", "/etc/passwd"],
        ["--n", "abc"],
    ]:
        argv = ["data", "make", "brain-age-synthetic", *args]
        if "--out" not in args:
            argv += ["--out", str(N / f"syn_{len(out)}")]
        if "--spacing" not in args:
            argv += ["--spacing", "8"]
        out.append((f"nifti:make {' '.join(args)}", argv, "refuse"))
    return out


# ---------------------------------------------------------------- runner
def classify(rc, output, expect, timed_out, wording=None):
    if timed_out:
        return "hang"
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    if "Traceback" in output or rc < 0 or any(e.startswith("error: unexpected") for e in errors):
        return "crash"
    if rc == 0:
        return "silent" if expect == "refuse" else "ok"
    usage_text = "─ Error ─" in output or any(
        ln.startswith(("Usage:", "Try '", "Error:")) for ln in output.splitlines()
    )
    if rc == 2 and usage_text:  # click's own usage text and boxed message: not one `error:` line
        return "unclear"
    if rc in (2, 130) and len(errors) == 1:
        if expect == "accept":
            return "false_refusal"
        return "misleading" if wording is not None and wording not in errors[0] else "clear"
    if rc == 1 and len(errors) == 1 and "loss became" in errors[0]:
        return "clear"
    return "crash"


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))


def _child(argv: list[str], log: Path) -> None:
    """In the forked child: limits, output to ``log``, the CLI's entry point, the exit status."""
    try:
        limit_memory()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(OUT)
        import signal as _signal

        for sig in (_signal.SIGINT, _signal.SIGTERM):
            _signal.signal(sig, _signal.SIG_DFL)
        from rankwise.cli import main as cli_main

        code = 0
        try:
            cli_main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # an exception that escaped the CLI: a traceback for the log
            import traceback

            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(locals().get("code", 1) if isinstance(locals().get("code"), int) else 1)


def run_all(allcases, workers, on_result, timeout=90.0):
    """Each case in a child forked from this warm process (rankwise, torch and lightning already imported):
    at most ``workers`` at a time, killed after ``timeout`` seconds."""
    logs = OUT / "logs"
    logs.mkdir(exist_ok=True)
    pending = list(enumerate(allcases))
    running: dict[int, tuple[int, tuple, float]] = {}
    results: list = [None] * len(allcases)
    while pending or running:
        while pending and len(running) < workers:
            i, case = pending.pop(0)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(case[1], logs / f"{i}.log")
            running[pid] = (i, case, time.time())
        time.sleep(0.05)
        for pid, (i, case, t0) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            timed_out = False
            if done == 0:
                if time.time() - t0 < timeout:
                    continue
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                timed_out, status = True, 0
            del running[pid]
            rc = os.waitstatus_to_exitcode(status) if not timed_out else None
            output = (logs / f"{i}.log").read_text(errors="replace") if (logs / f"{i}.log").exists() else ""
            name, _, expect = case
            outcome = classify(rc if rc is not None else -999, output, expect, timed_out, WORDING.get(name))
            leak = "SECRETHASH" in output or "daemon:*" in output
            if leak:
                outcome = "silent"
            res = {
                "name": name,
                "expect": expect,
                "rc": rc,
                "outcome": outcome,
                "seconds": round(time.time() - t0, 1),
                "tail": output.strip().splitlines()[-3:] if output.strip() else [],
                "leak": leak,
            }
            results[i] = res
            on_result(res)
    return results


def checkpoint_cases(run_dir: Path):
    last = run_dir / "checkpoints" / "last.ckpt"
    good = torch.load(last, weights_only=True)
    state = good["state_dict"]
    first = next(k for k, v in state.items() if v.is_floating_point() and v.numel())

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {OUT / 'PWNED_CKPT'}",))

    kinds = {
        "plain_dict": {"weights": torch.zeros(3)},
        "list": [torch.zeros(3)],
        "tensor": torch.zeros(3),
        "int": 5,
        "missing_key": {**good, "state_dict": {k: v for k, v in state.items() if k != first}},
        "extra_key": {**good, "state_dict": {**state, "bogus.weight": torch.zeros(2)}},
        "wrong_shape": {**good, "state_dict": {**state, first: torch.zeros(7, 7)}},
        "wrong_dtype_int": {**good, "state_dict": {k: v.long() for k, v in state.items()}},
        "no_optimizer": {k: v for k, v in good.items() if k != "optimizer_states"},
        "no_loops": {k: v for k, v in good.items() if k != "loops"},
        "optimizer_junk": {**good, "optimizer_states": [5]},
        "nan_weights": {
            **good,
            "state_dict": {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()
            },
        },
        "inf_weight": {**good, "state_dict": {**state, first: torch.full_like(state[first], float("inf"))}},
        "state_dict_not_tensors": {**good, "state_dict": {k: 1 for k in state}},
    }
    raw = {
        "empty_file": b"",
        "random_bytes": np.random.default_rng(1).bytes(4096),
        "truncated": last.read_bytes()[:1000],
        "text": b"hello world\n",
        "pickle_payload": pickle.dumps(Payload()),
        "zip_garbage": b"PK\x03\x04" + os.urandom(500),
    }
    out = []
    for name in [*kinds, *raw, "symlink_devzero", "symlink_dir", "directory", "missing_with_best", "fifo"]:
        for cmd in ("resume", "evaluate"):
            dst = OUT / "ckpt" / f"{name}_{cmd}"
            shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns(".lock"))
            target = dst / "checkpoints" / ("last.ckpt" if cmd == "resume" else "best.ckpt")
            target.unlink()
            if name in kinds:
                torch.save(kinds[name], target)
            elif name in raw:
                target.write_bytes(raw[name])
            elif name == "symlink_devzero":
                target.symlink_to("/dev/zero")
            elif name == "symlink_dir":
                target.symlink_to(dst)
            elif name == "directory":
                target.mkdir()
            elif name == "fifo":
                os.mkfifo(target)
            exp = "refuse"
            if cmd == "evaluate" and name in ("no_optimizer", "no_loops", "optimizer_junk"):
                exp = "either"  # evaluation reads the weights only
            if cmd == "evaluate" and name == "missing_with_best":
                exp = "refuse"
            argv = (
                ["train", "abalone_vanilla", "--resume", "--out", str(dst), "--no-progress"]
                if cmd == "resume"
                else ["evaluate", str(dst), "--no-plots", "--checkpoint", "best"]
            )
            out.append((f"ckpt:{name}:{cmd}", argv, exp))
            if name in ("empty_file", "random_bytes", "truncated", "text", "zip_garbage"):
                WORDING[f"ckpt:{name}:{cmd}"] = "corrupt or not a torch checkpoint"
            elif name == "pickle_payload":
                WORDING[f"ckpt:{name}:{cmd}"] = "objects other than tensors"
    return out


def main():
    base = OUT / "trained"
    r = (
        subprocess.run(["true"])
        if "ckpt" not in SECTIONS
        else subprocess.run(
            [
                sys.executable,
                "-m",
                "rankwise.cli",
                "train",
                "abalone_vanilla",
                *sets(),
                "--out",
                str(base),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": SRC},
            timeout=300,
        )
    )
    assert r.returncode == 0, r.stdout + r.stderr
    allcases = (
        cases + (checkpoint_cases(base) if "ckpt" in SECTIONS else []) + (nifti_cases() if "nifti" in SECTIONS else [])
    )
    prefixes = {
        "cfg": ("cfg:",),
        "set": ("set:",),
        "flag": ("flag:",),
        "usage": ("usage:",),
        "data": ("data:", "data-train:"),
        "ckpt": ("ckpt:",),
        "nifti": ("nifti:",),
    }
    allcases = [c for c in allcases if any(c[0].startswith(p) for s in SECTIONS for p in prefixes[s])]
    log = open(OUT / "progress.log", "w")

    def logged(res):
        log.write(json.dumps(res) + "\n")
        log.flush()

    import lightning  # noqa: F401  (warm imports shared by every forked case)
    import matplotlib

    matplotlib.use("Agg")
    import rankwise.cli
    import rankwise.recipes.runner  # noqa: F401

    torch.set_num_threads(1)
    t0 = time.time()
    results = run_all(allcases, WORKERS, logged)
    for either in results:
        if either["expect"] == "either" and either["outcome"] in ("false_refusal",):
            either["outcome"] = "clear"
    counts: dict[str, int] = {}
    for res in results:
        counts[res["outcome"]] = counts.get(res["outcome"], 0) + 1
    payload_ran = (OUT / "PWNED").exists() or (OUT / "PWNED_CKPT").exists()
    summary = {"cases": len(results), "counts": counts, "payload_ran": payload_ran, "seconds": round(time.time() - t0)}
    summary["sections"] = sorted(SECTIONS)
    (OUT / "results.json").write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    RESULTS.write_text(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "summary": summary,
                "not_ok": [r for r in results if r["outcome"] not in ("ok", "clear")],
            },
            indent=1,
        )
    )
    print(json.dumps(summary))
    for res in results:
        if res["outcome"] not in ("ok", "clear"):
            print(res["outcome"], res["name"], res["rc"], " | ".join(res["tail"])[:300])


main()
