"""Cost of the post-hoc explainers (issue 24): image-model-explainer passes per second, one JSON on stdout.

For each model (seeded random weights: speed does not depend on the values) and each explainer of
:data:`xbench.explain.EXPLAINERS` that applies to it, the time of ``ExplainedAdapter.predict`` on a batch of
``--batch-size`` images and ``--classes`` prompts, after ``--warmup`` untimed calls, over ``--iters`` timed calls
(CUDA synchronised). ``native`` is the model's own ``predict`` (no gradients) for reference. Reported per
(model, explainer): ``images_per_s`` (images explained, all classes, per second), ``image_classes_per_s``
(× classes) and, on CUDA, ``peak_gpu_bytes``; an explainer a model cannot take (no ``explain_layer`` /
``explain_attention`` in its YAML) is listed under ``skipped`` with the reason.

    python benchmarks/bench_explainers.py --device cuda            # the H100 table (docs/performance.md)
    python benchmarks/bench_explainers.py --tiny                   # CPU smoke version (tests)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
MODELS = ["medklip", "mavl", "kad", "carzero", "devide", "clip", "biomedclip", "ref_xattn", "ref_patchsim"]
PROMPTS = ["atelectasis", "cardiomegaly", "pleural effusion", "infiltration", "mass", "nodule", "pneumonia",
           "pneumothorax", "consolidation", "edema", "emphysema", "fibrosis", "pleural thickening", "hernia"]


def build(name: str, device: str, folder: Path) -> Any:
    """The model with seeded random weights (reference models: their committed weights)."""
    from xbench.models import create_model

    if name.startswith("ref_"):
        return create_model(name, device=device)
    weights = None
    if name == "biomedclip":  # its random init needs the published config files (the tests' helper writes them)
        spec = importlib.util.spec_from_file_location("biomedclip_folder", REPO / "tests" / "models" / "biomedclip_folder.py")
        helper = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helper)
        weights = helper.write_folder(folder / "biomedclip")
    return create_model(name, weights=weights, device=device, random_init=True)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_calls(fn: Any, device: str, warmup: int, iters: int) -> float:
    """Seconds per call of ``fn`` after ``warmup`` calls (CUDA synchronised)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The result JSON; with ``--out`` it is also rewritten after every model, so a run cut short keeps what it
    measured. A model that fails to build or run is listed under ``errors`` and the next one goes on."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    prompts = PROMPTS[: args.classes]
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    errors: list[dict[str, str]] = []
    result = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
              "torch": torch.__version__, "batch_size": args.batch_size, "classes": len(prompts),
              "ig_steps": args.ig_steps, "warmup": args.warmup, "iters": args.iters, "results": rows,
              "skipped": skipped}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in args.models:
            try:
                measure_model(name, device, Path(tmp), prompts, args, rows, skipped, errors)
            except Exception as exc:  # reported, and the other models still run
                errors.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            if errors:
                result["errors"] = errors
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=1))
    return result


def measure_model(name: str, device: str, tmp: Path, prompts: list[str], args: argparse.Namespace,
                  rows: list[dict[str, Any]], skipped: list[dict[str, str]], errors: list[dict[str, str]]) -> None:
    """Time the native pass and every applicable explainer of one model; appends to ``rows`` / ``skipped`` /
    ``errors`` (an explainer that fails is reported there and the next one runs)."""
    from xbench.explain import EXPLAINERS, explained

    adapter = build(name, device, tmp)
    rng = np.random.default_rng(0)
    pixels = torch.stack([adapter.preprocess(rng.random((320, 320), dtype=np.float32))
                          for _ in range(args.batch_size)]).to(device)
    candidates: list[tuple[str, Any]] = [("native", lambda a=adapter, x=pixels: a.predict(x, prompts))]
    for method in args.explainers:
        needs = EXPLAINERS[method].requires
        if needs and not adapter.config.get(needs):
            skipped.append({"model": name, "explainer": method, "reason": f"no {needs} in the model YAML"})
            continue
        options = {"n_steps": args.ig_steps} if method == "ig" else {}
        wrapped = explained(adapter, method, **options)
        candidates.append((method, lambda w=wrapped, x=pixels: w.predict(x, prompts)))
    for method, fn in candidates:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        try:
            seconds = time_calls(fn, device, args.warmup, args.iters)
        except Exception as exc:
            errors.append({"model": name, "explainer": method, "error": f"{type(exc).__name__}: {exc}"})
            continue
        row = {"model": name, "explainer": method, "seconds_per_batch": round(seconds, 5),
               "images_per_s": round(args.batch_size / seconds, 3),
               "image_classes_per_s": round(args.batch_size * len(prompts) / seconds, 3)}
        if device.startswith("cuda"):
            row["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
        rows.append(row)


def parse(argv: list[str] | None) -> argparse.Namespace:
    from xbench.explain import EXPLAINERS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--explainers", nargs="+", default=list(EXPLAINERS), choices=list(EXPLAINERS))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--classes", type=int, default=14, help=f"prompts per image (at most {len(PROMPTS)})")
    p.add_argument("--ig-steps", type=int, default=16, help="Integrated Gradients path points")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--tiny", action="store_true", help="CPU smoke version: reference models, 2 images, 2 classes")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.device, args.batch_size, args.classes = ["ref_xattn", "ref_patchsim"], "cpu", 2, 2
        args.ig_steps, args.warmup, args.iters = 4, 1, 1
    if not 1 <= args.classes <= len(PROMPTS):
        p.error(f"--classes must be in 1..{len(PROMPTS)}")
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
