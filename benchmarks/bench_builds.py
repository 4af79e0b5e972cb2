"""Seconds to build networks from checkpoints already in memory: the ``from_checkpoint`` path every real run takes.

The checkpoints are the seeded random-init networks' own state dicts (made before timing, not timed), so the work is
the same in any version of XBench that has these entry points: compare two trees by running this script with each
on ``PYTHONPATH`` (docs/performance.md, "How a run is organised for speed"). Prints JSON: per network the median of ``--repeats`` builds.

    python benchmarks/bench_builds.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def builders(folder: Path) -> dict[str, Callable[[], object]]:
    """name -> a build from a checkpoint in memory (or, for the BERT text encoder, a folder written once)."""
    from transformers import BertConfig, BertModel

    from xbench.models._common import HashWordTokenizer, seeded_build
    from xbench.models.carzero import CARZeroAdapter, synthetic_vocab
    from xbench.models.clip import CLIPAdapter, build_clip
    from xbench.models.text import load_bert_folder

    clip = build_clip(0).state_dict()
    random_carzero = __import__("xbench").create_model("carzero", random_init=True)
    carzero_ckpt = {"state_dict": random_carzero.model.state_dict()}
    vocab = synthetic_vocab(random_carzero.model.text_encoder.model.config.vocab_size)
    bert = seeded_build(0, lambda: BertModel(BertConfig(vocab_size=28996), add_pooling_layer=False))
    bert.config.to_json_file(str(folder / "config.json"))
    torch.save(bert.state_dict(), folder / "pytorch_model.bin")
    return {
        "clip": lambda: CLIPAdapter.from_checkpoint(clip),
        "carzero": lambda: CARZeroAdapter.from_checkpoint(carzero_ckpt, HashWordTokenizer(97), vocab),
        "bert_text_encoder": lambda: load_bert_folder(folder),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        builds = builders(Path(tmp))
        seconds: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(args.repeats):
            for name, build in builds.items():
                started = time.perf_counter()
                build()
                seconds[name].append(time.perf_counter() - started)
    result = {name: round(statistics.median(s), 3) for name, s in seconds.items()}
    result["total"] = round(sum(result.values()), 3)
    print(json.dumps({"median_seconds": result, "repeats": args.repeats, "threads": torch.get_num_threads()}))
    return result


if __name__ == "__main__":
    main()
