# As run on the device (round 12, first burst, code 43f6b62). .device_carry/exp/cmp.py = round12_cmp_stores.py.
# round 12 call 2 (same 4-GPU host): torchrun with 1, 2 and 4 GPUs on the same full-scale stand-ins, cold, then stores and tables against call 1's default
set -u
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); G=${G:-1,2,4}
B="--root /tmp/full --scale 1.0 --bootstrap 1000 --workers 16 --weights files"
timeout 540 python3 benchmarks/bench_gpu.py $B --out /tmp/m --phases multi --gpus $G > $OUT/multi.log 2>&1; cp /tmp/m/bench_gpu.json $OUT/multi.json
echo "multi $(( $(date +%s) - T0 ))s"
for g in ${G//,/ }; do python3 .device_carry/exp/cmp.py /tmp/f/default /tmp/m/multi_$g | head -c 300; echo; done
python3 - <<'P'
import json, os, sys
from pathlib import Path
sys.path.insert(0, "benchmarks"); import bench_gpu
d=json.load(open(os.environ['OUT']+"/multi.json")); print(d.get("errors"))
for g in (1,2,4):
    m=d.get(f"multi_{g}")
    if not m: continue
    print(g, {k:m.get(k) for k in ["wall_seconds","infer_wall_seconds","after_inference_seconds","speedup","infer_speedup","baseline","returncode"]}, [(r.get("startup_seconds"), r["wall_seconds"], r["build_seconds"]) for r in m["ranks"]])
    if m.get("returncode")==0: print("  tables", bench_gpu.tables_equal(Path("/tmp/f/default"), Path(f"/tmp/m/multi_{g}"), decimals=12))
    else: print(m.get("stderr_tail"))
P
echo "done $(( $(date +%s) - T0 ))s"
