"""Precision of the reference models (issue 22 item 6): fp32 against tf32 / bf16 on the phantom, one JSON on stdout.

The two reference models trained by XBench (``ref_xattn``, ``ref_patchsim``, committed weights) run on the first
``--cases`` cases of the phantom test split, once per ``--precisions`` entry (the run config's ``precision``; see
:mod:`xbench.inference.speed`: ``fp32`` is true float32 with TF32 off, ``tf32`` TF32 tensor-core matmuls / convolutions,
``bf16`` / ``fp16`` CUDA autocast). Everything else is the phantom config's (grid, batch, float16 maps); the
bootstrap is off so the tables hold point values only. An untimed fp32 run goes first (CUDA start-up, phantom
generation, disk cache); the timed fp32 run after it is the reference, and ``fp32_repeat`` (a second fp32 run)
shows the run-to-run noise floor.

Reported per precision: ``infer_seconds`` (inference wall time, both models, from ``xbench.workflows.run.run``),
``eval_seconds`` (the metric tables), ``passes_per_s`` (cases × models / infer seconds), the max |score| and
|map| difference from fp32 over all cases (``bench_gpu.deviation``), and per metric the max |Δ| of the tidy
table's ``value`` over every (dataset, model, class / aggregate) row, plus how many rows differ at 2 decimals.
On CPU the autocast and TF32 switches do nothing, so every deviation there is 0 (the ``--tiny`` smoke test).

    python benchmarks/bench_precision.py --device cuda --cases 300     # docs/performance.md
    python benchmarks/bench_precision.py --tiny                        # CPU smoke version (tests)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODELS = ["ref_xattn", "ref_patchsim"]


def run_once(out: Path, *, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    """One phantom run (inference, then the tables, timed apart) into ``out``; returns the timings."""
    from xbench.spec.config import RunConfig
    from xbench.evaluation.evaluate import evaluate_run
    from xbench.workflows.run import run

    raw = {"output_dir": str(out), "datasets": [{"name": "phantom", "split": "test", "cases": args.cases}],
           "models": [{"name": m} for m in args.models], "precision": precision, "device": args.device,
           "batch_size": args.batch_size, "bootstrap": {"replicates": 0, "seed": 0}}
    cfg = RunConfig.from_dict(raw)
    shutil.rmtree(out, ignore_errors=True)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    run(cfg, progress=False, evaluate=False)
    infer = time.perf_counter() - start
    start = time.perf_counter()
    evaluate_run(cfg, progress=False)
    return {"infer_seconds": round(infer, 3), "eval_seconds": round(time.perf_counter() - start, 3),
            "passes_per_s": round(args.cases * len(args.models) / infer, 1)}


def table_deltas(a: Path, b: Path, decimals: int = 2) -> dict[str, Any]:
    """Per metric: max |Δ value| between two runs' tidy tables and the rows that differ at ``decimals``."""
    import pandas as pd

    ta, tb = (pd.read_parquet(p / "tables" / "metrics.parquet") for p in (a, b))
    keys = [c for c in ta.columns if c not in ("value", "ci_low", "ci_high")]
    both = ta.merge(tb, on=keys, suffixes=("_a", "_b"))
    if len(both) != len(ta) or len(ta) != len(tb):
        raise RuntimeError(f"metric tables do not line up: {len(ta)} vs {len(tb)} rows, {len(both)} matched")
    both["diff"] = (both["value_a"] - both["value_b"]).abs()
    both["differs"] = ~((both["value_a"].round(decimals) == both["value_b"].round(decimals))
                        | (both["value_a"].isna() & both["value_b"].isna()))
    per = {}
    for metric, rows in both.groupby("metric", sort=False):
        worst = rows["diff"].max()
        per[str(metric)] = {"max_abs_diff": 0.0 if pd.isna(worst) else float(f"{worst:.3g}"),
                            "rows": len(rows), f"rows_differing_{decimals}dp": int(rows["differs"].sum())}
    return per


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from bench_gpu import deviation

    work = Path(args.work or tempfile.mkdtemp(prefix="xbench_precision_"))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "cases": args.cases, "models": args.models, "batch_size": args.batch_size,
        "precisions": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        run_once(work / "warmup", precision="fp32", args=args)
        result["warmup_seconds"] = round(time.perf_counter() - t, 2)
        names = ["fp32", "fp32_repeat"] + [p for p in args.precisions if p != "fp32"]
        for name in names:
            precision = "fp32" if name == "fp32_repeat" else name
            row = run_once(work / name, precision=precision, args=args)
            if name != "fp32":
                row["deviation_from_fp32"] = deviation(work / "fp32", work / name)
                row["tables_vs_fp32"] = table_deltas(work / "fp32", work / name)
                row["max_abs_table_diff"] = max((m["max_abs_diff"] for m in row["tables_vs_fp32"].values()), default=0.0)
            result["precisions"][name] = row
            print(f"# {name}: {json.dumps({k: v for k, v in row.items() if k != 'tables_vs_fp32'})}",
                  file=sys.stderr, flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    from xbench.inference.speed import PRECISIONS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=300, help="phantom test cases")
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--precisions", nargs="+", default=["tf32", "bf16"], choices=list(PRECISIONS),
                   help="compared with fp32 (which always runs, twice)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--work", help="keep the runs here (default: a temporary folder, removed)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke version: 12 cases, fp32 against bf16")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    if args.tiny:
        args.cases, args.device, args.precisions, args.batch_size = 12, "cpu", ["bf16"], 6
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.cases < 1:
        p.error("--cases must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    result = measure(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
