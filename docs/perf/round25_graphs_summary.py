"""Round 25 (issue 22, round 17): CUDA graphs on/off, from the raw JSON and run logs of the two calls.

usage: python docs/perf/round25_graphs_summary.py   (from the repository root)
"""
import io
import json
import tarfile
from pathlib import Path

PERF = Path(__file__).parent
KEYS = ["whole_seconds", "infer_seconds", "eval_seconds", "decode_seconds", "passes_per_s", "gpu_alone_passes_per_s"]


def logs(tgz: Path) -> dict[str, list[dict]]:
    with tarfile.open(tgz) as tar:
        return {Path(m.name).stem: json.load(io.TextIOWrapper(tar.extractfile(m)))
                for m in tar.getmembers() if m.isfile()}


for call, scale, arms in [("quarter", 0.25, "abcd"), ("half", 0.5, "abc")]:
    runs = logs(PERF / f"round25_h200_{call}_graphs_run_logs.tgz")
    print(f"== scale {scale}")
    for t in arms:
        d = json.loads((PERF / f"round25_h200_{call}_graphs_{t}.json").read_text())
        for phase, name in [("default", "cold"), ("cached", "warm")]:
            m = d[phase]
            graphs = {k: v for k, v in m["cuda_graph"].items() if v.get("replayed")}
            failed = sorted({f for v in m["cuda_graph"].values() for f in v.get("failed", [])})
            on = "on " if graphs or failed else "off"
            last = max(m["built_since_start"].values())
            ready = m["eval_timeline"]["events"]["standin_vindr_cxr"]["ready"]
            log = runs[f"{t}_run_log_{name}"]
            vindr_wait = sum(e.get("decode_seconds", 0) for e in log if "vindr" in e["dataset"])
            print(f"{t} graphs {on} {name}: " + ", ".join(f"{k} {m[k]}" for k in KEYS)
                  + f", last network built {last:.1f} s, VinDr-CXR inferred at {ready} s, its pairs waiting for inputs "
                  f"{vindr_wait:.1f} s, gpu peak {max(v['gpu_peak_gb'] for v in m['per_model'].values())} GB, "
                  f"batches replayed {sum(v['replayed'] for v in graphs.values())}"
                  + (f", failed recordings: {failed}" if failed else ""))
