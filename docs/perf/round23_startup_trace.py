"""Round 15 (issue 22): when each start-up step of a fresh `xbench run` process happens (this machine, CPU).
usage: PYTHONPATH=<tree> XBENCH_MANIFESTS=<stand-ins>/manifests python round23_startup_trace.py run --config <cfg> --quiet
The config: benchmarks/bench_gpu.py run_config of stand-ins at scale 0.02, size-div 4, fraction 0.1, weight files,
decode_ahead: true, num_workers 2, a fresh cache_dir (round23_startup_trace.txt)."""
import sys, time, functools, threading
T0 = time.perf_counter()
def stamp(msg): print(f"[{time.perf_counter()-T0:7.2f}] {threading.current_thread().name[:14]:14s} {msg}", file=sys.stderr, flush=True)
stamp("start")
import xbench.inference.runner as R, xbench.inference.preflight as P, xbench.inference.feeds as F, xbench.models.base as B
stamp("runner imported")
def wrap(mod, name, label=None, show=lambda a, k: ""):
    f = getattr(mod, name)
    @functools.wraps(f)
    def g(*a, **k):
        s = show(a, k); stamp(f"> {label or name} {s}")
        try: return f(*a, **k)
        finally: stamp(f"< {label or name} {s}")
    setattr(mod, name, g)
wrap(P, "preflight")
wrap(R, "open_dataset")
wrap(R, "input_twin", show=lambda a, k: a[0])
wrap(R, "open_model", show=lambda a, k: a[0].name)
wrap(F, "new_feed")
wrap(R, "assign_chunks")
wrap(R, "hash_ahead")
wrap(F, "fresh_rows")
import xbench.inference.cache as C
orig_start = C.InputFeed.start
def start(self, *a, **k): stamp("> feed.start"); r = orig_start(self, *a, **k); stamp("< feed.start"); return r
C.InputFeed.start = start
from xbench.cli import main
sys.exit(main(sys.argv[1:]))
