set -u
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); ls /tmp/full/.gen_done || exit 3
B="--root /tmp/full --scale 1.0 --bootstrap 1000 --workers 16 --weights files --out /tmp/f"
timeout 300 python3 benchmarks/bench_gpu.py $B --phases default > /tmp/fd.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/full_default.json
tail -3 /tmp/fd.log | cut -c1-300; echo "cold $(( $(date +%s) - T0 ))s"
timeout 250 python3 benchmarks/bench_gpu.py $B --phases cached > /tmp/fc.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/full_cached.json
tail -3 /tmp/fc.log | cut -c1-300; echo "warm $(( $(date +%s) - T0 ))s"
python3 - <<'P'
import json, os
for f in ["full_default","full_cached"]:
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    for ph in ("default","cached"):
        x=d.get(ph)
        if x: print(f, ph, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","store_mb","image_model_passes"]}); print("  ", x.get("decode_profile"))
    print(d.get("errors"))
P
