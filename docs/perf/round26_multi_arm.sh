# round 18: one multi-GPU arm of the checkout (new), run from inside its tree. usage: bash r18m.sh <tag> new <gpus> <scale> <timeout s>
set -u
export HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
tag=$1; code=$2; G=$3; S=$4; T0=$(date +%s)
D=$PWD; if [ "$code" = old ]; then D=$PWD/.device_carry/old; fi
export PYTHONPATH=/tmp/site:$D
B="--root /tmp/s$S --scale $S --bootstrap 1000 --workers 16 --weights files"
(cd $D && timeout $5 python3 $D/benchmarks/bench_gpu.py $B --out /tmp/$tag --phases multi --gpus $G > /tmp/$tag.log 2>&1); cp /tmp/$tag/bench_gpu.json $OUT/$tag.json
python3 - "$OUT/$tag.json" "$tag" <<'P'
import json, sys
d=json.load(open(sys.argv[1])); print(sys.argv[2], "errors", d.get("errors"))
for g in (1,2,4):
    m=d.get(f"multi_{g}")
    if not m: continue
    print(g, {k:m.get(k) for k in ["wall_seconds","infer_wall_seconds","after_inference_seconds","speedup","returncode"]}, [(r.get("startup_seconds"), r["wall_seconds"], r["build_seconds"], r["model_seconds"], r["decode_wait_seconds"], r["cases"]) for r in m["ranks"]])
    if m.get("returncode"): print(m.get("stderr_tail"))
    t=m.get("eval_timeline")
    if t: print("  eval created", t["created"], "run", t["events"].get("run"))
P
echo "$tag $(( $(date +%s) - T0 ))s"
