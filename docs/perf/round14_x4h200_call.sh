set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
nvidia-smi -L; nproc; T0=$(date +%s)
python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 32 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
timeout 260 python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/a --phases default,multi --gpus 2,4 --scale 0.25 --bootstrap 1000 --workers 16 --decode-ahead auto > $OUT/a.log 2>&1; cp /tmp/a/bench_gpu.json $OUT/ahead.json; echo "ahead $(( $(date +%s) - T0 ))s"
timeout 120 python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/b --phases default --scale 0.25 --bootstrap 1000 --workers 16 --decode-ahead false > $OUT/b.log 2>&1; cp /tmp/b/bench_gpu.json $OUT/serial.json; echo "serial $(( $(date +%s) - T0 ))s"
python3 .device_carry/exp/cmp.py /tmp/b/default /tmp/a/default > $OUT/cmp_ab.json; head -c 400 $OUT/cmp_ab.json; echo
for g in 2 4; do python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/a/multi_$g > $OUT/cmp_m$g.json; head -c 300 $OUT/cmp_m$g.json; echo; done
if [ $(( $(date +%s) - T0 )) -lt 470 ]; then timeout 100 python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/c --phases default --scale 0.25 --bootstrap 1000 --workers 16 --decode-ahead auto > $OUT/c.log 2>&1; cp /tmp/c/bench_gpu.json $OUT/ahead2.json; echo "ahead2 $(( $(date +%s) - T0 ))s"; python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/c/default | head -c 300; fi
python3 - <<'P'
import json
for f in ["ahead","serial","ahead2"]:
    try: d=json.load(open(f"{__import__('os').environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    x=d.get("default",{}); print(f, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","built_while_decoding"]}, d.get("errors"))
    for g in (2,4):
        m=d.get(f"multi_{g}")
        if m: print(g, {k:m.get(k) for k in ["wall_seconds","infer_wall_seconds","speedup","infer_speedup","returncode"]})
P
