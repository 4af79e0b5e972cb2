"""Calibration of the six twinned models' inputs: one by one vs a pool of threads (cache._LEVELS swapped)."""
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from xbench.inference import cache
from xbench.models.base import input_twin
ms = ["clip", "medklip", "kad", "mavl", "carzero", "devide"]
class Serial:
    def map(self, f, it): return map(f, it)
out = {}
for rnd in range(2):
    for name, pool in (("serial", Serial()), ("pool4", ThreadPoolExecutor(4)), ("pool_cores", ThreadPoolExecutor(os.cpu_count()))):
        cache._LEVELS[:] = [pool]
        tw = {m: input_twin(m, None) for m in ms}
        t = time.perf_counter(); keys = [cache.model_input(tw[m]).key for m in ms]
        out.setdefault(name, []).append(round(time.perf_counter() - t, 3)); out.setdefault("keys_" + name, keys)
print(json.dumps(out))
