# round 19: one 1-GPU arm from its tree: new = the checkout, old = .device_carry/old (b8ece99). usage: bash r19arm.sh <tag> <new|old> <scale> <timeout s> <cold|warm>
# cold: --phases default into /tmp/<tag> (a fresh decode cache); warm: --phases cached in a fresh process, reading the decode cache of /tmp/a (the first cold arm's)
set -u
export HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
tag=$1; code=$2; S=$3; kind=$5; T0=$(date +%s)
D=$PWD; [ "$code" = old ] && D=$PWD/.device_carry/old
export PYTHONPATH=/tmp/site:$D
mkdir -p /tmp/res /tmp/logs
if [ "$kind" = cold ]; then out=/tmp/$tag; rm -rf $out; ph=default; else out=/tmp/a; rm -rf /tmp/a/cached; ph=cached; fi
(cd $D && timeout $4 python3 $D/benchmarks/bench_gpu.py --root /tmp/s$S --scale $S --bootstrap 1000 --workers 16 --weights files --out $out --phases $ph > /tmp/logs/$tag.log 2>&1); cp $out/bench_gpu.json /tmp/res/$tag.json || tail -20 /tmp/logs/$tag.log
cp $out/$ph/run_log.json /tmp/logs/${tag}_run_log.json 2>/dev/null
python3 - "/tmp/res/$tag.json" "$tag" "$code" "$ph" <<'P'
import json, sys
d=json.load(open(sys.argv[1])); m=d.get(sys.argv[4])
if not m: print(sys.argv[2], "missing", d.get("errors")); sys.exit()
print(sys.argv[2], sys.argv[3], sys.argv[4], {k: m.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","build_seconds"]})
print("  built", m.get("built_since_start"))
import os
log = f"/tmp/logs/{sys.argv[2]}_run_log.json"
if os.path.exists(log):
    seen = {}
    for e in json.load(open(log)):
        if e.get("decode_once"): seen[e["dataset"]] = e["decode_once"]
    print("  decoded / from cache", sum(v["decoded"] for v in seen.values()), sum(v["from_cache"] for v in seen.values()))
P
sha256sum $out/$ph/tables/*.csv $out/$ph/tables/*.json 2>/dev/null | awk '{print $1}' | sha256sum | cut -c1-16 | sed "s/^/$tag tables /"
[ "$kind" = warm ] && rm -rf /tmp/store_$tag && cp -r $out/$ph/store /tmp/store_$tag
echo "$tag $(( $(date +%s) - T0 ))s"
