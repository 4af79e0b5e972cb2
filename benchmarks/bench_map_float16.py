"""Relative error of the results store's float16 maps, per map source, on phantom images.

For each source (the reference models' own maps, and each explainer over ref_xattn) the maps of ``--cases`` phantom
images are cast as the runner casts them (``astype(float16)``); printed per source: the largest relative error over
the values at least 2^-28 of their map's largest |value| (the range the bound covers), the share of non-zero values
below that range, and whether any value became non-finite.

    python benchmarks/bench_map_float16.py --cases 8
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from xbench.datasets import load_dataset
from xbench.explain import explained
from xbench.models import create_model


def measure(maps: np.ndarray) -> dict[str, float]:
    m = maps.astype(np.float64)
    half = maps.astype(np.float16).astype(np.float64)
    top = np.abs(m).reshape(*m.shape[:2], -1).max(-1)[..., None, None]
    covered = (np.abs(m) >= top * 2.0**-28) & (m != 0)
    rel = np.abs(half - m)[covered] / np.abs(m)[covered]
    return {"max_rel_error": float(rel.max()) if rel.size else 0.0,
            "below_range": float(((m != 0) & ~covered).sum() / max((m != 0).sum(), 1)),
            "non_finite": int((~np.isfinite(half)).sum())}


def main(argv=None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=8)
    args = ap.parse_args(argv)
    data = load_dataset("phantom", split="test", cases=args.cases)
    prompts = list(data.findings)
    out = {}
    for name in ("ref_xattn", "ref_patchsim"):
        model = create_model(name)
        px = torch.stack([model.preprocess(data[i].image()) for i in range(args.cases)])
        out[name] = measure(model.predict(px, prompts).maps.numpy())
        if name == "ref_xattn":
            for method in ("gradcam", "gradcampp", "gradxinput", "ig", ):
                out[f"{name}+{method}"] = measure(explained(model, method).predict(px, prompts).maps.numpy())
    for source, row in out.items():
        print(f"{source:22s} max rel. error {row['max_rel_error']:.3e}  below range {row['below_range']:.2%}  "
              f"non-finite {row['non_finite']}")
    print(f"bound 2^-11 = {2.0**-11:.3e}")
    return out


if __name__ == "__main__":
    main()
