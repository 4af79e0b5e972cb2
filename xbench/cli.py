"""``xbench`` command line: a thin layer over the library (no logic here).

    xbench run --config CONFIG [--shard i/n] [--overwrite] [--no-eval]
    xbench merge --config CONFIG --from DIR [DIR ...]
    xbench evaluate --config CONFIG
    xbench reproduce --config CONFIG [--notebooks DIR] [--timeout S]
    xbench manifest check|build DATASET --root DIR [--out FILE]
    xbench list models|datasets
    xbench weights check NAME DIR
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import XBenchError


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes i/n (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard needs 0 <= i < n, got {text!r}")
    return i, n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xbench", description="XBench: grounding of chest X-ray vision-language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="inference into the results store, then metric tables")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir", help="override the config's output_dir")
    p.add_argument("--device", help="override the config's device (cpu, cuda, auto)")
    p.add_argument("--shard", type=_shard, help="process only shard i of n (e.g. 0/4); evaluate later with `merge`")
    p.add_argument("--overwrite", action="store_true", help="recompute even if the store has results")
    p.add_argument("--no-eval", action="store_true", help="only fill the store")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("merge", help="join shards written to other folders, then evaluate")
    p.add_argument("--config", required=True)
    p.add_argument("--from", dest="sources", nargs="+", required=True)
    p.add_argument("--output-dir")

    p = sub.add_parser("evaluate", help="metric tables from the store (no inference)")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir")

    p = sub.add_parser("reproduce", help="run every notebook in order through papermill")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir")
    p.add_argument("--device")
    p.add_argument("--notebooks", help="folder of notebooks (default: the repository's notebooks/)")
    p.add_argument("--timeout", type=int, default=1800, help="per-cell execution timeout in seconds")
    p.add_argument("--kernel", default="python3")
    p.add_argument("--figures-dir", help="also copy tables/figures here (the repository's figures/ for the phantom default)")

    p = sub.add_parser("manifest", help="check a local dataset copy against its manifest, or write its case table")
    p.add_argument("action", choices=["check", "build"])
    p.add_argument("dataset")
    p.add_argument("--root", required=True)
    p.add_argument("--out", help="case table path for `build` (.csv or .parquet)")

    p = sub.add_parser("weights", help="verify a local weights folder for a model (files, safe read, strict keys, tokenizer)")
    p.add_argument("action", choices=["check"])
    p.add_argument("model")
    p.add_argument("folder")

    p = sub.add_parser("list", help="registered models or datasets")
    p.add_argument("what", choices=["models", "datasets"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except XBenchError as exc:
        print(f"xbench: error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    from .config import RunConfig

    if args.command == "list":
        from .registry import list_datasets, list_models

        print("\n".join(list_models() if args.what == "models" else list_datasets()))
        return 0
    if args.command == "weights":
        from .models.weights_check import check_weights

        report = check_weights(args.model, args.folder)
        print(report.format())
        return 0 if report.ok else 1
    if args.command == "manifest":
        from . import manifests

        if args.action == "check":
            report = manifests.check(args.dataset, args.root)
            print(report.format())
            return 0 if report.ok else 1
        out = args.out or f"{args.dataset}_cases.csv"
        manifests.build(args.dataset, args.root, out)
        print(f"wrote {out}")
        return 0

    overrides = {"output_dir": getattr(args, "output_dir", None), "device": getattr(args, "device", None)}
    cfg = RunConfig.from_yaml(args.config, **overrides)
    if args.command == "run":
        from .runner import run

        out = run(cfg, shard=args.shard, overwrite=args.overwrite, progress=not args.quiet, evaluate=not args.no_eval)
        print(f"results in {out}")
    elif args.command == "merge":
        from .runner import merge

        print(f"results in {merge(cfg, args.sources)}")
    elif args.command == "evaluate":
        from .evaluate import evaluate_run

        evaluate_run(cfg)
        print(f"tables in {cfg.output_dir}/tables")
    elif args.command == "reproduce":
        from .reproduce import reproduce

        out = reproduce(args.config, output_dir=cfg.output_dir, device=cfg.device, notebooks=args.notebooks,
                        timeout=args.timeout, kernel=args.kernel, figures_dir=args.figures_dir)
        print(f"notebooks, tables and figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
