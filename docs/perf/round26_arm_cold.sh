# round 18: one 1-GPU arm, cold only, from its tree: new = the checkout, old = .device_carry/old (82f54b8), graphs = .device_carry/graphs (1703b32 + 9fe5643). usage: bash round26_arm_cold.sh <tag> <new|old|graphs> <scale> <timeout s>
set -u
export HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
tag=$1; code=$2; S=$3; T0=$(date +%s)
D=$PWD; [ "$code" = old ] && D=$PWD/.device_carry/old; [ "$code" = graphs ] && D=$PWD/.device_carry/graphs
export PYTHONPATH=/tmp/site:$D
rm -rf /tmp/$tag
(cd $D && timeout $4 python3 $D/benchmarks/bench_gpu.py --root /tmp/s$S --scale $S --bootstrap 1000 --workers 16 --weights files --out /tmp/$tag --phases default > /tmp/$tag.log 2>&1); cp /tmp/$tag/bench_gpu.json $OUT/$tag.json || tail -20 /tmp/$tag.log
mkdir -p /tmp/logs; cp /tmp/$tag/default/run_log.json /tmp/logs/${tag}_run_log_cold.json 2>/dev/null; cp /tmp/$tag/cached/run_log.json /tmp/logs/${tag}_run_log_warm.json 2>/dev/null
python3 - "$OUT/$tag.json" "$tag" "$code" <<'P'
import json, sys
d=json.load(open(sys.argv[1]))
for ph in ("default", "cached"):
    m=d.get(ph)
    if not m: print(sys.argv[2], ph, "missing", d.get("errors")); continue
    print(sys.argv[2], sys.argv[3], ph, {k: m.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","build_seconds"]})
    print("  built", m.get("built_since_start"))
    ev=m.get("eval_timeline",{}).get("events",{})
    print("  ready", {k.replace("standin_",""): v.get("ready") for k,v in ev.items() if k!="run"})
P
for ph in default cached; do sha256sum /tmp/$tag/$ph/tables/*.csv /tmp/$tag/$ph/tables/*.json 2>/dev/null | awk '{print $1}' | sha256sum | cut -c1-16 | sed "s/^/$tag $ph tables /"; done
echo "$tag $(( $(date +%s) - T0 ))s"
