"""Written in round 25 (issue 22, round 17), run in round 26 (issue 22, round 18): the decode stage's thread against a busy GPU, with CARZero's area factor made per
call (as before round 17) or cached on the device (round 17), on equal work in one process.

The decode stage (xbench.inference.device_stage.DeviceStage) takes the same stacks in every arm: RSNA-like stacks of
16 images of 1024² (uint8) and VinDr-like stacks of 3 images of 3,072² (uint16), through the plans of the six networks
of the benchmark (kad_512 left out). A second thread keeps the GPU busy with float32 matrix products on its own stream,
as the models' passes do in a run. Each arm reports the stage thread's seconds by step (``DeviceStage.seconds``) and
the wall time until every stack's codes are back. Arms alternate: per-call, cached, per-call, cached; the codes of
every arm are compared with the first arm's.

usage: python docs/perf/round26_stage_stalls.py [stacks per size] (on a CUDA machine, from the repository root)
"""
import json
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from xbench.inference import gpu_preprocess
from xbench.inference.device_stage import DeviceStage
from xbench.inference.gpu_preprocess import plan_for, preprocess_standins

N = int(sys.argv[1]) if len(sys.argv) > 1 else 40
dev = torch.device("cuda")
cached_factor = gpu_preprocess._area_factor


def per_call_factor(cells, device):  # what resize_area did before this round
    return torch.tensor(np.float32(1.0 / cells), device=device)


@dataclass
class Row:
    source: torch.Tensor
    inputs: dict = field(default_factory=dict)


stand = preprocess_standins()
plans = {name: plan_for(stand[name]) for name in ["clip", "medklip", "kad", "mavl", "carzero", "devide"]}
rng = np.random.default_rng(0)
small = [torch.from_numpy(rng.integers(0, 256, (1024, 1024), dtype=np.uint8)).pin_memory() for _ in range(16)]
large = [torch.from_numpy(rng.integers(0, 4096, (3072, 3072)).astype(np.uint16)).pin_memory() for _ in range(3)]

stop = threading.Event()


def busy():
    a = torch.randn(8192, 8192, device=dev)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        while not stop.is_set():
            for _ in range(4):
                a = (a @ a).clamp_(-1, 1)
            side.synchronize()


def arm(factor, load):
    gpu_preprocess._area_factor = factor
    got = []
    stage = DeviceStage(plans, dev, lambda item, keys: got.append({k: item.inputs[k] for k in keys}),
                        max_images=16, max_pixels=1 << 25, depth=3)
    side = torch.cuda.Stream(dev)
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.cuda.stream(side):
        for _ in range(N):
            for image in small:
                stage.put(Row(image))
            for image in large:
                stage.put(Row(image))
        stage.drain()
    wall = time.perf_counter() - started
    gpu_preprocess._area_factor = cached_factor
    return {"load": load, "factor": factor.__name__, "wall_s": round(wall, 3),
            **{f"thread_{k}_s": round(v, 3) for k, v in stage.seconds.items()}, "stacks": stage.stacks}, got


for factor in (per_call_factor, cached_factor):  # warm-up: caches, cuBLAS, the pinned pool
    arm(factor, "none")
results, reference = [], None
for load in ("none", "busy"):
    thread = None
    if load == "busy":
        thread = threading.Thread(target=busy, daemon=True)
        thread.start()
        time.sleep(1.0)
    for factor in (per_call_factor, cached_factor, per_call_factor, cached_factor):
        row, got = arm(factor, load)
        if reference is None:
            reference = got
        row["codes_equal_first_arm"] = len(got) == len(reference) and all(
            a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(got, reference))
        print(json.dumps(row), flush=True)
        results.append(row)
    if thread is not None:
        stop.set()
        thread.join()
print(torch.cuda.get_device_name(0), "stacks per arm", results[0]["stacks"])
