"""Level and power of the paired model comparison (``compare_models``) under simulated data.

Every simulated dataset goes through the library's own path: per model a :func:`~xbench.metrics.scored_table`
(per-pair rows with Dice / IoU curves, labels and scores; no bootstrap, the test does not use it), then
:func:`~xbench.metrics.compare_models` (paired permutation test, Holm over the model pairs of each
(finding, metric) column). A "finding" of the tables is one simulated dataset, so one call scores ``--sims``
datasets at once.

Simulation (per dataset, ``n`` images, ``K`` models): an image's difficulty ``u ~ N(0, 1)`` is shared by the
models, a model's quality on it is ``q = u + e`` with ``e ~ N(0, 1)`` of its own, so two models correlate at 0.5.
Pointing hit ``q > −0.3``; the Dice curve over τ is ``sigmoid(q) · exp(−((τ − c) / 0.25)²)`` with the peak ``c``
per (image, model) around 0.5 (so the best τ is re-chosen), IoU = D / (2 − D); a label ``y ~ Bernoulli(1/2)`` per
image and a score ``sigmoid(1.2·y + v + f)`` (``v`` shared, ``f`` per model). Under the null every model draws the
same way (exchangeable on each image); for power, model 0 adds ``--shift`` to ``q`` and ``±shift`` (by the label)
to its score logit.

Reported per (n, K, metric): the family-wise error (share of null datasets where Holm rejected any pair) with its
Monte-Carlo SE ``sqrt(f (1 − f) / R)``, the pass mark ``FWER ≤ 5 % + 2 SE``, and the power (share of the
``K − 1`` true differences of model 0 that were rejected, under the shift).

    python benchmarks/bench_significance.py --sims 100 --power-sims 40 --n-perm 500   # docs/statistics.md

``--tiny`` runs one small cell (the test suite's version: tests/evaluation/test_compare.py).
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from xbench.metrics import compare_models, scored_table
from xbench.metrics.compare import compared_metrics

THRESHOLDS = np.round(np.linspace(0.0, 1.0, 21), 2)  # a coarser τ grid than the runs' (speed); the rule is the same
METRICS = compared_metrics(0.5)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def simulate(rng: np.random.Generator, n: int, k: int, sims: int, shift: float = 0.0) -> dict[str, object]:
    """``k`` models' scored tables over ``sims`` simulated datasets (the findings ``s0`` …) of ``n`` images."""
    cases = pd.Index([f"c{i}" for i in range(n)])
    findings = [f"s{s}" for s in range(sims)]
    u = rng.normal(size=(sims, n, 1))
    q = u + rng.normal(size=(sims, n, k))
    q[:, :, 0] += shift
    peak = 0.5 + 0.12 * rng.normal(size=(sims, n, k))
    y = rng.integers(0, 2, size=(sims, n)).astype(float)
    v = rng.normal(size=(sims, n, 1))
    logit = 1.2 * y[..., None] + v + rng.normal(size=(sims, n, k))
    logit[:, :, 0] += shift * (2 * y - 1)  # model 0 separates the labels better
    score = _sigmoid(logit)
    fixed = int(np.flatnonzero(THRESHOLDS == 0.5)[0])
    labels = pd.DataFrame(y.T, index=cases, columns=findings)
    out = {}
    for m in range(k):
        dice = _sigmoid(q[:, :, m, None]) * np.exp(-((THRESHOLDS - peak[:, :, m, None]) / 0.25) ** 2)  # (S, n, T)
        iou = dice / (2 - dice)
        flat_d, flat_i = dice.reshape(sims * n, -1), iou.reshape(sims * n, -1)
        pairs = pd.DataFrame({"case_id": np.tile(cases, sims), "finding": np.repeat(findings, n),
                              "pointing": (q[:, :, m] > -0.3).ravel().astype(float),
                              "dice_fixed": flat_d[:, fixed], "iou_fixed": flat_i[:, fixed],
                              "dice_curve": list(flat_d), "iou_curve": list(flat_i)})
        scores = pd.DataFrame(score[:, :, m].T, index=cases, columns=findings)
        out[f"m{m}"] = scored_table(pairs, model=f"m{m}", dataset="sim", labels=labels, scores=scores,
                                    findings=findings, thresholds=THRESHOLDS, n_boot=0, cases=cases)
    return out


def study(n: int, k: int, sims: int, *, shift: float = 0.0, n_perm: int = 1000, seed: int = 0,
          block: int = 50) -> pd.DataFrame:
    """Per metric: rejections of ``sims`` datasets: ``any`` (Holm rejected some pair), ``true`` (share of model 0's
    pairs rejected)."""
    rng = np.random.default_rng([seed, n, k, int(shift * 1000)])
    rows = []
    for start in range(0, sims, block):
        tables = simulate(rng, n, k, min(block, sims - start), shift)
        comp, _ = compare_models(tables, dataset="sim", metrics=METRICS, n_perm=n_perm, test="permutation",
                                 seed=int(rng.integers(2**31)))
        comp = comp[comp["finding"].str.startswith("s")]
        for (finding, metric), g in comp.groupby(["finding", "metric"], sort=False):
            rows.append({"metric": metric, "any": bool(g["significant"].any()),
                         "true": float(g.loc[g["model_a"] == "m0", "significant"].mean())})
    return pd.DataFrame(rows)


def table(ns: Sequence[int], ks: Sequence[int], sims: int, power_sims: int, shift: float, n_perm: int,
          seed: int) -> pd.DataFrame:
    out = []
    for n in ns:
        for k in ks:
            null = study(n, k, sims, n_perm=n_perm, seed=seed)
            alt = study(n, k, power_sims, shift=shift, n_perm=n_perm, seed=seed) if power_sims else None
            for metric in METRICS:
                f = null.loc[null["metric"] == metric, "any"].to_numpy(float)
                fwer, se = f.mean(), np.sqrt(f.mean() * (1 - f.mean()) / len(f))
                power = float(alt.loc[alt["metric"] == metric, "true"].mean()) if alt is not None else np.nan
                out.append({"n": n, "K": k, "metric": metric, "fwer": fwer, "mc_se": se, "replicates": len(f),
                            "pass": bool(fwer <= 0.05 + 2 * se),
                            "power": power})
    return pd.DataFrame(out)


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[30, 40, 80, 150])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 7])
    ap.add_argument("--sims", type=int, default=100, help="null datasets per cell")
    ap.add_argument("--power-sims", type=int, default=40, help="shifted datasets per cell (0: no power)")
    ap.add_argument("--shift", type=float, default=0.5, help="model 0's shift of quality (and of its score logit toward the label)")
    ap.add_argument("--n-perm", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the table as JSON records here")
    ap.add_argument("--tiny", action="store_true", help="one cell: n = 30, K = 3, 100 null datasets, 200 swaps")
    args = ap.parse_args(argv)
    if args.tiny:
        args.n, args.k, args.sims, args.power_sims, args.n_perm = [30], [3], 100, 0, 200
    start = time.perf_counter()
    result = table(args.n, args.k, args.sims, args.power_sims, args.shift, args.n_perm, args.seed)
    wall = time.perf_counter() - start
    print(result.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"# {len(result)} cells, all pass: {bool(result['pass'].all())}; wall {wall:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"wall_s": wall, "cells": result.to_dict("records")}, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
