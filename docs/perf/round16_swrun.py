"""Run benchmarks/bench_gpu.py with the interpreter's GIL switch interval set first: swrun.py SECONDS ARGS..."""
import runpy, sys
sys.setswitchinterval(float(sys.argv[1]))
sys.argv = ["benchmarks/bench_gpu.py", *sys.argv[2:]]
runpy.run_path("benchmarks/bench_gpu.py", run_name="__main__")
