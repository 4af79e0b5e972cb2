"""round 15: one 2-GPU torchrun arm of `xbench run` on the bench's multi config, with or without rank 0's evaluation.
usage: python r15arm.py <stand-in root> <tag> <eval|noeval> <gpus>"""
import importlib.util, json, os, shutil, subprocess, sys, time
from pathlib import Path
import yaml
spec = importlib.util.spec_from_file_location("bench", "benchmarks/bench_gpu.py"); bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
from xbench.core.workers import same_imports_env
src, tag, mode, gpus = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
root = Path(src); os.environ["XBENCH_MANIFESTS"] = str(root / "manifests")
weights = bench._standin_weights().write_weight_folders(bench.MODELS, root / "weights")
raw = bench.run_config(root, Path("/tmp/x"), models=bench.MODELS, weights=weights, device="cuda", precision="fp32",
                       batch_size=128, num_workers=16, decode_once=True, decode_ahead="auto")
raw["bootstrap"] = {"replicates": 1000, "seed": 0}
out = Path(f"/tmp/{tag}"); cache = Path(f"/tmp/cache_{tag}")
shutil.rmtree(out, ignore_errors=True); shutil.rmtree(cache, ignore_errors=True)
raw["output_dir"], raw["cache_dir"] = str(out), str(cache)
cfg = Path(f"/tmp/{tag}.yaml"); cfg.write_text(yaml.safe_dump(raw))
env = {**os.environ, **bench.MULTICAST_OFF, "PYTHONWARNINGS": "ignore", **same_imports_env()}
launched, t = time.time(), time.perf_counter()
p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", "-m", "xbench.cli",
                    "run", "--config", str(cfg), "--quiet"] + (["--no-eval"] if mode == "noeval" else []), env=env, capture_output=True, text=True)
wall = time.perf_counter() - t
ranks = bench.rank_timings(out, launched)
r = {"tag": tag, "mode": mode, "rc": p.returncode, "wall": round(wall, 2), "ranks": ranks}
if p.returncode: r["stderr"] = p.stderr[-3000:]
timing = out / "evaluation_timing.json"
if timing.exists():
    r["eval_timing"] = json.loads(timing.read_text())
print(json.dumps(r))
Path(os.environ.get("OUT", "/tmp")).joinpath(f"{tag}.json").write_text(json.dumps(r, indent=1))
