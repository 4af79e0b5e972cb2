"""Cost of the post-hoc explainers: image-model-explainer passes per second against their cost model, one JSON.

For each model (seeded random weights: speed does not depend on the values) and each explainer of
:data:`xbench.explain.EXPLAINERS` that applies to it, the time of ``ExplainedAdapter.predict`` on a batch of
``--batch-size`` images and ``--classes`` prompts, after ``--warmup`` untimed calls, over ``--iters`` timed calls
(CUDA synchronised; fp32 with TF32 off, as a run's ``precision: fp32``). ``native`` is the model's own ``predict``
(no gradients) for reference. Reported per
(model, explainer): ``images_per_s`` (images explained, all classes, per second), ``image_classes_per_s``
(× classes), ``native_fraction`` (of the same model's native rate) and, on CUDA, ``peak_gpu_bytes``; an explainer a
model cannot take (no ``explain_layer`` / ``explain_attention`` in its YAML) is listed under ``skipped`` with the
reason.

Cost model (``docs/explainers.md``): per model, the measured seconds of one forward pass that keeps its graph
(``forward_seconds``, the batch), of one full backward of one class's logits to the pixels (``backward_seconds``)
and of one to the ``explain_layer`` (``head_backward_seconds``); per explainer the passes it needs give
``cost_model_seconds`` per batch (Grad-CAM family: forward + C head backwards; gradient × input and attention
gradients: forward + C full backwards; IG: a gradient-free forward + steps × (forward + C full backwards)), and
``cost_model_fraction`` = cost-model seconds / measured seconds (1: the explainer runs at its passes' speed).

Whole run (``--whole-run``): one explainer over the GPU benchmark's stand-in (``benchmarks/bench_gpu.py``:
generated under ``--root`` when absent, its stand-in weight files) for the six paper models it runs, end to end
through ``xbench run`` (decode once, explain, store, evaluate) with every model entry carrying ``explainer:``; JSON
like ``bench_gpu.py``'s (``args``, ``environment``, ``generate``, ``weights``, the phase ``explained`` with its
``whole_seconds`` and, with ``--phases native,explained``, the phase ``native``: the same run with the models' own
maps; each phase decodes from a cold cache of its own). A stand-in already under ``--root`` and its weight files
are reused.

    python benchmarks/bench_explainers.py --device cuda            # the per-model table (docs/performance.md)
    python benchmarks/bench_explainers.py --tiny                   # CPU smoke version (tests)
    python benchmarks/bench_explainers.py --whole-run --scale 1.0 --explainer gradcam --root /tmp/standin --out w.json
    python benchmarks/bench_explainers.py --whole-run --tiny --root /tmp/standin_tiny   # CPU smoke version (tests)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
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
PAPER_MODELS = ["clip", "medklip", "kad", "mavl", "carzero", "devide"]  # bench_gpu.MODELS without the prior
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


def _sig(value: float, digits: int = 6) -> float:
    """``value`` to ``digits`` significant figures: CPU pass times of a few milliseconds keep their precision
    (fixed decimals would not), so the cost model can be re-added from the printed pass times."""
    return float(f"{value:.{digits}g}")


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
    from xbench.inference.speed import precision_mode

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), precision_mode("fp32", device):
        warnings.simplefilter("ignore")  # fp32: TF32 off on CUDA, as a run's precision fp32
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
    from xbench.explain.base import FALLBACK_NOTE

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
    with torch.no_grad():  # prompt caches filled without a graph, as ExplainedAdapter does
        adapter.predict(pixels[:1], prompts)
    try:
        passes: dict[str, float | None] | None = pass_seconds(adapter, pixels, prompts, device, args)
    except Exception as exc:  # no cost model for this model; its rates are still measured
        errors.append({"model": name, "explainer": "cost_model", "error": f"{type(exc).__name__}: {exc}"})
        passes = None
    native_rate = None
    for method, fn in candidates:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                seconds = time_calls(fn, device, args.warmup, args.iters)
        except Exception as exc:
            errors.append({"model": name, "explainer": method, "error": f"{type(exc).__name__}: {exc}"})
            continue
        row = {"model": name, "explainer": method, "seconds_per_batch": _sig(seconds),
               "images_per_s": round(args.batch_size / seconds, 3),
               "image_classes_per_s": round(args.batch_size * len(prompts) / seconds, 3)}
        if method != "native":  # whether the classes went through one batched backward (base.FALLBACK_NOTE)
            row["per_class_fallback"] = any(str(w.message).startswith(FALLBACK_NOTE) for w in caught)
        if method == "native":
            native_rate = args.batch_size / seconds
        elif native_rate:
            row["native_fraction"] = round(args.batch_size / seconds / native_rate, 4)
        limit = None if passes is None else cost_model_seconds(method, passes, len(prompts), args.ig_steps)
        if limit is not None:
            row.update({**{k: _sig(v) for k, v in (passes or {}).items() if v is not None},
                        "cost_model_seconds": _sig(limit),
                        "cost_model_images_per_s": round(args.batch_size / limit, 3),
                        "cost_model_fraction": _sig(limit / seconds, 4)})
        if device.startswith("cuda"):
            row["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
        rows.append(row)


def pass_seconds(adapter: Any, pixels: torch.Tensor, prompts: list[str], device: str, args: argparse.Namespace
                 ) -> dict[str, float | None]:
    """Seconds per batch of the passes the cost model counts: ``forward_seconds`` (the adapter's forward that keeps
    its graph, as the explainers run it), ``backward_seconds`` (one class's logits back to the pixels) and
    ``head_backward_seconds`` (back to the ``explain_layer``; None without one). Each backward is timed alone
    (after its own untimed forward), over ``--iters`` calls after ``--warmup``."""
    from xbench.explain import gradients_through_adapters
    from xbench.explain.base import forward_logits, module_at

    layer = module_at(adapter, adapter.config["explain_layer"]) if adapter.config.get("explain_layer") else None
    captured: list[torch.Tensor] = []

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        captured.clear()
        x = pixels.clone().requires_grad_(True)
        return x, forward_logits(adapter, x, prompts)[1]

    def backward(to_layer: bool) -> float:
        x, logits = forward()
        if not logits.requires_grad:
            return 0.0
        _sync(device)
        start = time.perf_counter()
        torch.autograd.grad(logits[:, 0].sum(), captured[0] if to_layer else x)
        _sync(device)
        return time.perf_counter() - start

    handle = layer.register_forward_hook(
        lambda m, a, out: captured.append(out[0] if isinstance(out, (tuple, list)) else out)) if layer else None
    try:
        with gradients_through_adapters():
            forward_s = time_calls(forward, device, args.warmup, args.iters)
            times: dict[str, float | None] = {"forward_seconds": forward_s}
            for key, to_layer in (("backward_seconds", False), ("head_backward_seconds", True)):
                if to_layer and layer is None:
                    times[key] = None
                    continue
                for _ in range(args.warmup):
                    backward(to_layer)
                times[key] = sum(backward(to_layer) for _ in range(args.iters)) / args.iters
    finally:
        if handle is not None:
            handle.remove()
    return times


def cost_model_seconds(method: str, passes: dict[str, float | None], classes: int, steps: int) -> float | None:
    """Seconds per batch that ``method``'s passes take at the measured pass times (``docs/explainers.md``), or None
    (native: no cost model; a layer explainer without a layer)."""
    fwd, full, head = passes["forward_seconds"], passes["backward_seconds"], passes["head_backward_seconds"]
    if method in ("gradcam", "gradcampp"):
        return None if head is None else fwd + classes * head
    if method in ("gradxinput", "attngrad"):
        return fwd + classes * full
    if method == "ig":
        return fwd + steps * (fwd + classes * full)
    return None


# -- the whole run --------------------------------------------------------------------------------
def _bench_gpu() -> Any:
    """``benchmarks/bench_gpu.py`` (this folder is not a package): its stand-ins, configs and timed runs."""
    spec = importlib.util.spec_from_file_location("bench_gpu", Path(__file__).with_name("bench_gpu.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # its stand-in writer is pickled by name
    spec.loader.exec_module(module)
    return module


def whole_run(args: argparse.Namespace) -> dict[str, Any]:
    """One explainer over the stand-in for ``--models``, end to end (module docstring); the JSON, also written to
    ``--out`` after each phase."""
    import shutil

    gpu = _bench_gpu()
    t0 = time.perf_counter()
    models = args.models
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "environment": gpu.environment()}
    root, out = Path(args.root), Path(args.work)

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1, default=str))

    if not (root / "manifests").is_dir():
        result["generate"] = gpu.generate(root, scale=args.scale, size_div=args.size_div, workers=args.gen_workers)
        save()
    os.environ["XBENCH_MANIFESTS"] = str(root / "manifests")
    import xbench.spec.registry as registry

    registry.MANIFEST_DIRS[:] = [root / "manifests"]
    weights = None
    if args.weights == "files" and any(m in gpu.RANDOM_INIT for m in models):
        started = time.perf_counter()
        weights = gpu._standin_weights().write_weight_folders(models, root / "weights")
        result["weights"] = {"seconds": round(time.perf_counter() - started, 2), "models": sorted(weights)}
        save()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    wanted = args.phases.split(",")
    unknown = set(wanted) - {"native", "explained", "none"}
    if unknown:
        raise SystemExit(f"--phases: unknown {sorted(unknown)}; known: native, explained, none (only the stand-in and "
                         "its weight files)")
    for phase, explainer in [(p, args.explainer if p == "explained" else None) for p in ("native", "explained")
                             if p in wanted]:
        raw = gpu.run_config(root, out / phase, models=models, weights=weights, device=device, precision="fp32",
                             batch_size=args.batch_size, num_workers=args.workers, decode_once=True,
                             cache_dir=str(out / f"cache_{phase}"))  # each phase decodes cold
        raw["bootstrap"] = {"replicates": args.bootstrap, "seed": 0}
        if explainer:
            raw["models"] = [{**entry, "explainer": explainer} for entry in raw["models"]]
        shutil.rmtree(out / f"cache_{phase}", ignore_errors=True)
        try:
            result[phase] = gpu.timed_run(raw, evaluate=True)
        except Exception as exc:  # reported; the next phase still runs
            result.setdefault("errors", {})[phase] = f"{type(exc).__name__}: {exc}"
        save()
    if "native" in result and "explained" in result and "whole_seconds" in result["native"]:
        result["explained"]["whole_vs_native"] = round(result["explained"]["whole_seconds"]
                                                       / result["native"]["whole_seconds"], 3)
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    save()
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    from xbench.explain import EXPLAINERS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=None, help=f"default: {MODELS}; whole run: {PAPER_MODELS}")
    p.add_argument("--explainers", nargs="+", default=list(EXPLAINERS), choices=list(EXPLAINERS))
    p.add_argument("--batch-size", type=int, default=None, help="default 16; whole run: 128 (bench_gpu's)")
    p.add_argument("--classes", type=int, default=14, help=f"prompts per image (at most {len(PROMPTS)})")
    p.add_argument("--ig-steps", type=int, default=16, help="Integrated Gradients path points")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--tiny", action="store_true", help="CPU smoke version: reference models, 2 images, 2 classes "
                                                       "(whole run: 0.2 %% of the stand-in, image sides / 4)")
    p.add_argument("--out", help="also write the JSON here")
    w = p.add_argument_group("whole run")
    w.add_argument("--whole-run", action="store_true", help="one explainer over the stand-in, end to end")
    w.add_argument("--explainer", default="gradcam", choices=list(EXPLAINERS))
    w.add_argument("--scale", type=float, default=1.0, help="fraction of every stand-in dataset's cases")
    w.add_argument("--size-div", type=int, default=1, help="divide every image side by this")
    w.add_argument("--root", default="standin", help="the stand-in folder (generated when it has no manifests)")
    w.add_argument("--work", default=None, help="the runs' output and cache folder (default: <root>/../explain_runs)")
    w.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decode processes")
    w.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1)
    w.add_argument("--bootstrap", type=int, default=1000, help="replicates of the evaluation")
    w.add_argument("--weights", default="files", choices=["files", "random"], help="as bench_gpu.py's --weights")
    w.add_argument("--phases", default="explained", help="comma-separated: explained (the explainer's run), native "
                                                        "(the same run with the models' own maps); none: only write "
                                                        "the stand-in and its weight files")
    args = p.parse_args(argv)
    if args.models is None:
        args.models = PAPER_MODELS if args.whole_run else MODELS
    if args.batch_size is None:
        args.batch_size = 128 if args.whole_run else 16
    if args.tiny and args.whole_run:
        args.models, args.device, args.batch_size, args.scale, args.size_div = ["ref_xattn"], "cpu", 8, 0.002, 4
        args.bootstrap, args.workers, args.gen_workers = 5, 0, 2  # decoded in this process
        args.phases = "native,explained" if args.phases == "explained" else args.phases  # both unless chosen
    elif args.tiny:
        args.models, args.device, args.batch_size, args.classes = ["ref_xattn", "ref_patchsim"], "cpu", 2, 2
        args.ig_steps, args.warmup, args.iters = 4, 1, 1
    if args.work is None:
        args.work = str(Path(args.root).resolve().parent / "explain_runs")
    if not 1 <= args.classes <= len(PROMPTS):
        p.error(f"--classes must be in 1..{len(PROMPTS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    result = whole_run(args) if args.whole_run else measure(args)
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
