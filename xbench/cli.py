"""``xbench`` command line: a thin layer over the library (no logic here).

    xbench check --config CONFIG [--device D] [--no-hash] [--deep]
    xbench run --config CONFIG [--shard i/n] [--overwrite] [--no-eval] [--no-check] [--keep-going]
    xbench merge --config CONFIG --from DIR [DIR ...]
    xbench evaluate --config CONFIG
    xbench reproduce --config CONFIG [--notebooks DIR] [--timeout S] [--keep-going] [-p NAME VALUE ...]
    xbench manifest check|build DATASET --root DIR [--out FILE]
    xbench list models|datasets [--names]
    xbench score --maps DIR|FILE.npz --dataset NAME [--split S] [--root DIR] [--output-dir DIR] [--name N]
    xbench report --run DIR [--out FILE.html]
    xbench export --run DIR [--tau best|T] [--margin M]
    xbench weights check NAME DIR

Every subcommand takes ``-q/--quiet`` (warnings and errors only, no progress), ``-v/--verbose``
(debug) and ``--config-path DIR`` (repeatable; a folder with ``models/`` and/or ``datasets/`` of
the user's own YAML files, added to ``$XBENCH_CONFIG_PATH``). Exit status: 0 success, 1 a check
found problems, 2 an error (one line, no traceback). ``CONFIG`` is a run YAML or the name of a shipped
one (``phantom``, ``paper``). ``xbench --help`` and usage errors import neither torch nor the library.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .core.errors import XBenchError

if TYPE_CHECKING:  # the CLI imports the library (and torch) only once a command needs it
    import pandas as pd

    from .spec.config import RunConfig


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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    common.add_argument("-v", "--verbose", action="store_true", help="debug messages")
    common.add_argument("--config-path", action="append", default=[], metavar="DIR",
                        help="folder with models/ and/or datasets/ YAML files of your own (repeatable; "
                             "also $XBENCH_CONFIG_PATH)")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(_commands={})

    def add(name: str, **kwargs: object) -> argparse.ArgumentParser:
        command = sub.add_parser(name, parents=[common], **kwargs)  # type: ignore[arg-type]
        parser.get_default("_commands")[name] = command
        return command

    p = add("check", help="preflight: data, images, weights, fit splits and device of a run config; nothing is computed")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir", help="override the config's output_dir")
    p.add_argument("--device", help="override the config's device (cpu, cuda, auto)")
    p.add_argument("--no-hash", action="store_true", help="do not compute SHA-256 of annotation files")
    p.add_argument("--deep", action="store_true", help="also decode every present image (in parallel) and list the "
                                                       "unreadable ones (exit 1 if any)")

    p = add("run", help="inference into the results store, then metric tables")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir", help="override the config's output_dir")
    p.add_argument("--device", help="override the config's device (cpu, cuda, auto)")
    p.add_argument("--shard", type=_shard, help="process only shard i of n (e.g. 0/4); evaluate later with `merge`")
    p.add_argument("--overwrite", action="store_true", help="recompute even if the store has results")
    p.add_argument("--no-eval", action="store_true", help="only fill the store")
    p.add_argument("--no-check", action="store_true", help="skip the preflight (`xbench check`) before inference")
    p.add_argument("--keep-going", action="store_true", help="go on with the other model × dataset pairs after one "
                                                             "fails; list the failures at the end (exit 2)")

    p = add("merge", help="join shards written to other folders, then evaluate")
    p.add_argument("--config", required=True)
    p.add_argument("--from", dest="sources", nargs="+", required=True)
    p.add_argument("--output-dir")

    p = add("evaluate", help="metric tables from the store (no inference)")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir")

    p = add("reproduce", help="run every notebook in order through papermill")
    p.add_argument("--config", required=True, help="run config: a YAML path or a shipped name (phantom, paper)")
    p.add_argument("--output-dir", help="override the config's output_dir (the notebooks' working folder; every "
                                        "output lands there)")
    p.add_argument("--device", help="override the config's device (cpu, cuda, auto)")
    p.add_argument("--notebooks", help="folder of notebooks (default: the repository's notebooks/)")
    p.add_argument("--timeout", type=int, default=1800, help="per-cell execution timeout in seconds")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name to run the notebooks in (default: "
                                                       "python3, this environment's)")
    p.add_argument("--figures-dir", help="also copy tables/figures here (the repository's figures/ for the phantom default)")
    p.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure; list failures at the end")
    p.add_argument("--no-check", action="store_true", help="skip the preflight before the notebooks")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="papermill parameter for every notebook that declares NAME (VALUE read as YAML: 3, 0.5, "
                        "true, text); repeatable")

    p = add("manifest", help="check a local dataset copy against its manifest, or write its case table")
    p.add_argument("action", choices=["check", "build"])
    p.add_argument("dataset")
    p.add_argument("--root", required=True)
    p.add_argument("--out", help="case table path for `build` (.csv or .parquet)")

    p = add("weights", help="verify a local weights folder for a model (files, safe read, strict keys, tokenizer)",
            epilog="exit status: 0 every file present and loading strictly; 1 problems found (a file missing, "
                   "unreadable or refused, or the architecture not matching; each listed in the report, counted on "
                   "stderr); 2 the command could not run (e.g. an unknown model), one 'xbench: error:' line")
    p.add_argument("action", choices=["check"])
    p.add_argument("model")
    p.add_argument("folder")

    p = add("list", help="registered models or datasets, as a table (weights, publisher, source, licence)")
    p.add_argument("what", choices=["models", "datasets"])
    p.add_argument("--names", action="store_true", help="names only, one a line")
    _add_beyond_commands(add)
    return parser


def _add_beyond_commands(add: "Callable[..., argparse.ArgumentParser]") -> None:
    """`xbench score` (your own maps → the run tables) and `xbench report` (HTML report of a run)."""
    p = add("score", help="score your own saliency maps (folder of .npz/.npy/.safetensors, one .npz, "
                     "or a cheXlocalize *_map.pkl folder)")
    p.add_argument("--maps", required=True, help="folder or .npz file of maps (see xbench.workflows.score)")
    p.add_argument("--dataset", required=True)
    p.add_argument("--split")
    p.add_argument("--root", help="dataset folder (default: $XBENCH_DATA/<dataset>)")
    p.add_argument("--classes", nargs="+", help="class of each channel of .npy maps / tasks to read")
    p.add_argument("--chexlocalize", action="store_true", help="--maps is a cheXlocalize *_map.pkl folder")
    p.add_argument("--name", default="user_maps", help="model name in the tables")
    p.add_argument("--output-dir", help="default: results/<name>-<dataset>")
    p.add_argument("--grid", type=int, nargs=2, default=(224, 224), metavar=("H", "W"))
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates (0: no CIs)")
    p.add_argument("--margin", type=int, nargs="+", default=[], help="also the tolerance pointing game at these "
                                                                       "margins (grid pixels): metric pointing@Npx")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="dataset option (e.g. cases=22 for the phantom); repeatable")
    p.add_argument("--compare-with", metavar="RUN_DIR", help="a run folder with this dataset in its store: compare the "
                                                             "maps with its models (tables/comparisons.csv)")

    p = add("report", help="one self-contained HTML report of an evaluated run (from the store alone)")
    p.add_argument("--run", required=True, help="the run's output folder")
    p.add_argument("--out", help="default: <run>/report.html")
    p.add_argument("--grid", type=int, nargs=2, metavar=("H", "W"), help="evaluation grid (default: from the tables)")
    p.add_argument("--cases-per-class", type=int, default=24, help="cases per class in the overlay browser")

    p = add("export", help="maps of a run → masks, boxes (COCO JSON, CSV) and per-case metric CSVs")
    p.add_argument("--run", required=True, help="the run's output folder")
    p.add_argument("--out", help="default: <run>/exports")
    p.add_argument("--tau", default="best", help="'best' (each class's best τ) or a number in [0, 1]")
    p.add_argument("--margin", type=int, default=0, help="pointing tolerance in grid pixels for the per-case CSV")
    p.add_argument("--grid", type=int, nargs=2, metavar=("H", "W"), help="evaluation grid (default: from the tables)")


def _score_or_report(args: argparse.Namespace) -> int:
    if args.command == "export":
        from .outputs.exports import export_run

        tau = args.tau if args.tau == "best" else float(args.tau)
        files = export_run(args.run, args.out, tau=tau, grid=args.grid, margin=args.margin)
        print(f"{len(files)} files under {args.out or str(args.run) + '/exports'}")
        return 0
    if args.command == "report":
        from .outputs.report import build_report

        print(f"report in {build_report(args.run, args.out, grid=args.grid, max_cases_per_class=args.cases_per_class)}")
        return 0
    from .workflows.score import evaluate_maps, read_chexlocalize

    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise XBenchError(f"--option takes KEY=VALUE, got {item!r}")
        options[key] = _yaml_value(value, f"--option {key}")
    maps = read_chexlocalize(args.maps, classes=args.classes) if args.chexlocalize else args.maps
    tables = evaluate_maps(maps, dataset=args.dataset, split=args.split, root=args.root,
                           classes=None if args.chexlocalize else args.classes, name=args.name,
                           output_dir=args.output_dir, grid=tuple(args.grid), bootstrap=args.bootstrap,
                           dataset_options=options, pointing_margins=args.margin, progress=not args.quiet,
                           compare_with=args.compare_with)
    print(_score_summary(tables["metrics"], args.name))
    out = args.output_dir or f"results/{args.name}-{args.dataset}"
    print(f"tables in {out}/tables")
    return 0


def _score_summary(metrics: pd.DataFrame, name: str) -> str:
    """`xbench score`'s printout: the dataset-level rows, one per model × metric, the scored maps (``name``) first,
    with a ``model`` column (with ``--compare-with`` the run's models follow, each row named)."""
    import pandas as pd

    from .metrics import DATASET_LEVEL

    level = metrics[metrics["finding"] == DATASET_LEVEL]
    order = [name, *sorted(set(level["model"]) - {name})]
    level = level.assign(model=pd.Categorical(level["model"], order, ordered=True)).sort_values(["model"], kind="stable")
    cols = ["model", "metric", "value", "ci_low", "ci_high", "n_pairs", "n_cases", "n_classes"]
    return level[cols].astype({"model": str}).to_string(index=False)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse; an unknown option is reported with its command's usage (not the top-level one) and a close match."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        import difflib

        command = parser.get_default("_commands")[args.command]
        options = [o for action in command._actions for o in action.option_strings]
        close = difflib.get_close_matches(extra[0], options, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    del args._commands
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    from .core.logs import setup_logging

    setup_logging(-1 if args.quiet else 1 if args.verbose else 0)
    _debug_context(args)
    try:
        from .spec.registry import add_search_dir

        for folder in args.config_path:
            add_search_dir(folder)
        return _dispatch(args)
    except XBenchError as exc:
        print(f"xbench: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except MemoryError:  # a reader that did not bound its work: still one line, never a traceback
        print("xbench: error: out of memory (an input asked for more memory than this machine gives; run with -v "
              "for the command's inputs)", file=sys.stderr)
        return 2


def _one_line(text: str, limit: int = 2000) -> str:
    """An error message on one line: line breaks joined, other control and bidi characters shown as ``\\uXXXX``
    (:func:`xbench.core.summary.visible`), at most ``limit`` characters."""
    import re

    from .core.summary import visible

    return visible(re.sub(r"\s*\n\s*", " ", text.strip()), limit)


def console() -> None:
    """The ``xbench`` command (and ``python -m xbench.cli``): :func:`main`, then exit with its code.

    Before the interpreter ends, every live object is frozen (:func:`gc.freeze`): its final collection would
    otherwise traverse all of them (tables, datasets, networks) just before the process's memory is returned anyway.
    That sweep took 1.9–2.2 s after a phantom run on a 2-core machine, against 0.3–0.4 s frozen
    Objects are still freed by reference counting; only the cycle search is skipped.
    :func:`main` itself never freezes, so code that calls it in-process keeps its collector.
    """
    import gc

    code = main()
    gc.freeze()
    sys.exit(code)


def _debug_context(args: argparse.Namespace) -> None:
    """``-v``: what this invocation works with (version, interpreter, arguments, search paths)."""
    import logging
    import os

    log = logging.getLogger("xbench.cli")
    if not log.isEnabledFor(logging.DEBUG):
        return
    from . import __version__
    from .spec.registry import MANIFEST_DIRS, MODEL_CONFIG_DIRS

    log.debug("xbench %s (%s) on Python %s", __version__, __file__, sys.version.split()[0])
    log.debug("arguments: %s", vars(args))
    log.debug("model config folders: %s; dataset manifest folders: %s", [str(p) for p in MODEL_CONFIG_DIRS],
              [str(p) for p in MANIFEST_DIRS])
    log.debug("environment: %s", {k: v for k, v in os.environ.items() if k.startswith(("XBENCH_", "HF_HUB"))})


def _parameters(pairs: list[list[str]]) -> dict[str, object]:
    """``-p NAME VALUE`` pairs → notebook parameters (values parsed as YAML scalars, like papermill's ``-y``)."""
    return {name: _yaml_value(value, f"-p {name}") for name, value in pairs}


def _yaml_value(text: str, where: str) -> object:
    """A command-line value read as YAML (aliases refused); malformed → :class:`XBenchError` naming ``where``."""
    import yaml

    from .spec.registry import load_yaml_text

    try:
        return load_yaml_text(text)
    except yaml.YAMLError as exc:
        raise XBenchError(f"{where}: invalid YAML value ({exc})") from None


def _list(args: argparse.Namespace) -> int:
    from .spec.listing import DATASET_COLUMNS, MODEL_COLUMNS, dataset_rows, format_table, model_rows
    from .spec.registry import list_datasets, list_models

    if args.names:
        print("\n".join(list_models() if args.what == "models" else list_datasets()))
    elif args.what == "models":
        print(format_table(model_rows(), MODEL_COLUMNS))
        print("\nWeights go in $XBENCH_WEIGHTS/<name>/ (or `weights: DIR` in the run config); XBench never downloads.")
    else:
        print(format_table(dataset_rows(), DATASET_COLUMNS))
        print("\nData go in $XBENCH_DATA/<name>/ (or `root: DIR`); `xbench manifest check NAME --root DIR` lists "
              "what is missing, with where to get it.")
    return 0


def _without_path(text: str, path: str) -> str:
    """``text`` with the repetitions of ``path`` (already at the start of the line) taken out.

    >>> _without_path("unreadable: FormatError: /d/a.png: not a PNG (/d/a.png)", "/d/a.png")
    'unreadable: FormatError: not a PNG'
    """
    if not path:
        return text
    for form in (f"{path}: ", f" ({path})", f"'{path}'", path):
        text = text.replace(form, "")
    return text


def _deep_check(cfg: "RunConfig") -> int:
    """Decode every present image of every dataset of ``cfg``; print the unreadable ones; 1 if any."""
    from .datasets import checks
    from .datasets import open_dataset
    from .inference.skips import decode_all

    bad_total = 0
    for spec in cfg.datasets:
        ds = open_dataset(spec)
        _, missing = checks.image_files(ds)
        decoded, bad = decode_all(ds, spec.name, missing=set(missing))
        bad_total += len(bad)
        print(f"dataset {spec.name} [{ds.split}]: decoded {decoded} of {decoded + len(bad)} present images, "
              f"{len(bad)} unreadable")
        for row in bad:
            print(f"  UNREADABLE {row['case_id']} {row['file']}: {_without_path(row['reason'] + ': ' + row['message'], row['file'])}")
    return 1 if bad_total else 0


def _dispatch(args: argparse.Namespace) -> int:
    from .spec.config import RunConfig

    if args.command in ("score", "report", "export"):
        return _score_or_report(args)
    if args.command == "list":
        return _list(args)
    if args.command == "weights":
        from .models.weights_check import check_weights

        report = check_weights(args.model, args.folder)
        print(report.format())
        if not report.ok:
            print(f"xbench: weights check: {report.problems} problem(s), listed above", file=sys.stderr)
        return 0 if report.ok else 1
    if args.command == "manifest":
        from .datasets import checks

        if args.action == "check":
            report = checks.check(args.dataset, args.root)
            print(report.format())
            return 0 if report.ok else 1
        out = args.out or f"{args.dataset}_cases.csv"
        checks.build(args.dataset, args.root, out)
        print(f"wrote {out}")
        return 0

    overrides = {"output_dir": getattr(args, "output_dir", None), "device": getattr(args, "device", None)}
    cfg = RunConfig.from_yaml(args.config, **overrides)
    import logging

    logging.getLogger("xbench.cli").debug("run config %s: %s", cfg.source, cfg.to_dict())
    if args.command == "check":
        from .preflight import preflight

        report = preflight(cfg, hashes=not args.no_hash)
        print(report.format())
        if not report.ok:  # each is listed once, in the report above (PROBLEM lines)
            print(f"{len(report.problems)} problem(s), listed above as PROBLEM", file=sys.stderr)
        deep = _deep_check(cfg) if args.deep else 0
        return 0 if report.ok and not deep else 1
    if args.command == "run":
        from .workflows.run import run

        out = run(cfg, shard=args.shard, overwrite=args.overwrite, progress=not args.quiet, evaluate=not args.no_eval,
                  check=not args.no_check, keep_going=args.keep_going)
        print(f"results in {out}" + ("" if args.no_eval or args.shard else f" (tables in {out}/tables, paper form "
                                                                            "in tables/paper)"))
    elif args.command == "merge":
        from .workflows.run import merge

        print(f"results in {merge(cfg, args.sources)}")
    elif args.command == "evaluate":
        from .evaluation.evaluate import evaluate_run

        from .outputs.tables import write_paper_tables

        evaluate_run(cfg)
        write_paper_tables(cfg.output_dir)
        print(f"tables in {cfg.output_dir}/tables (paper form in tables/paper)")
    elif args.command == "reproduce":
        from .workflows.reproduce import reproduce

        out = reproduce(args.config, output_dir=cfg.output_dir, device=cfg.device, notebooks=args.notebooks,
                        timeout=args.timeout, kernel=args.kernel, figures_dir=args.figures_dir,
                        progress=not args.quiet, keep_going=args.keep_going, check=not args.no_check,
                        parameters=_parameters(args.parameter))
        print(f"notebooks, tables and figures in {out}")
    return 0


if __name__ == "__main__":
    console()
