"""Round 12: one VinDr-CXR pair of bench_evaluate.py with the stand-in's grounding pairs (about 30 % of 3,000 cases
positive for each of 21 classes, one box each: 900 per class) instead of the 75 per class it assumes for the real set.
Usage (repo root): PYTHONPATH=$PWD python docs/perf/round20_bench_evaluate_vindr_pairs.py"""
import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("bench_evaluate", Path("benchmarks/bench_evaluate.py"))
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_evaluate"] = bench
spec.loader.exec_module(bench)
bench.ASSUMED_PAIRS["vindr_cxr"] = [900] * 21
sys.argv = ["bench_evaluate.py", "--datasets", "vindr_cxr", "--models", "1"]
bench.main()
