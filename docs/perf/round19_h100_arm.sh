# As run on the device (round 11). There .device_carry/exp/r11arm.sh = round19_h100_arm.sh, .device_carry/exp/cmp.py = round12_cmp_stores.py,
# .device_carry/old = git archive d369478 xbench benchmarks, .device_carry/wheels = the wheels named in docs/performance.md.
# usage: bash r11arm.sh <tag> <code: new|old> <phase: default|cached>
set -u
export HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
tag=$1; code=$2; phase=$3; T0=$(date +%s)
D=$PWD; if [ "$code" = old ]; then D=$PWD/.device_carry/old; fi
export PYTHONPATH=/tmp/site:$D
B="--root /tmp/full --scale 1.0 --bootstrap 1000 --workers 16 --weights files --out /tmp/f"
timeout 280 python3 $D/benchmarks/bench_gpu.py $B --phases $phase > /tmp/$tag.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/$tag.json
tail -2 /tmp/$tag.log | cut -c1-200
python3 - "$OUT/$tag.json" "$phase" "$tag" <<'P'
import json, sys
d=json.load(open(sys.argv[1])); x=d.get(sys.argv[2]) or {}
print(sys.argv[3], {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","passes_per_s","gpu_alone_passes_per_s","store_mb"]}, d.get("errors"))
t=x.get("eval_timeline")
if t:
    print("  eval created", t["created"], "workers", t["workers"], "run", t["events"].get("run"))
    for k,v in t["events"].items():
        if k!="run": print("   ", k, v)
P
rm -rf /tmp/keep_$tag; if [ "$phase" = cached ]; then mv /tmp/f/cached /tmp/keep_$tag; else mv /tmp/f/default /tmp/keep_$tag; fi
echo "$tag $(( $(date +%s) - T0 ))s"
