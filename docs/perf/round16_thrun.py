"""Run benchmarks/bench_gpu.py with torch's intra-op threads of the bench process set first: thrun.py N ARGS... (0: as is)"""
import runpy, sys
import torch
n = int(sys.argv[1])
if n:
    torch.set_num_threads(n)
print("torch threads", torch.get_num_threads(), flush=True)
sys.argv = ["benchmarks/bench_gpu.py", *sys.argv[2:]]
runpy.run_path("benchmarks/bench_gpu.py", run_name="__main__")
