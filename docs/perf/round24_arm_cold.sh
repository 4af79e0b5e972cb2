# round 16: one 1-GPU default-phase arm (cold), run from inside its tree. usage: bash r16d.sh <tag> <new|old> <scale> <timeout s>
set -u
export HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
tag=$1; code=$2; S=$3; T0=$(date +%s)
D=$PWD; if [ "$code" = old ]; then D=$PWD/.device_carry/old; fi
export PYTHONPATH=/tmp/site:$D
rm -rf /tmp/$tag
(cd $D && timeout $4 python3 $D/benchmarks/bench_gpu.py --root /tmp/s$S --scale $S --bootstrap 1000 --workers 16 --weights files --out /tmp/$tag --phases default > /tmp/$tag.log 2>&1); cp /tmp/$tag/bench_gpu.json $OUT/$tag.json || tail -20 /tmp/$tag.log
python3 - "$OUT/$tag.json" "$tag" "$code" <<'P'
import json, sys
d=json.load(open(sys.argv[1])); m=d["default"]
print(sys.argv[2], sys.argv[3], {k: m.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","build_seconds"]})
p=m.get("decode_profile",{}); print("  decode wall", p.get("wall"), "read", p.get("read"), "pool_idle", p.get("pool_idle"))
ev=m.get("eval_timeline",{}).get("events",{})
print("  ready", {k.replace("standin_",""): v.get("ready") for k,v in ev.items() if k!="run"}, "run", ev.get("run"))
P
sha256sum /tmp/$tag/default/tables/*.csv /tmp/$tag/default/tables/*.json 2>/dev/null | awk '{print $1}' | sha256sum | cut -c1-16 | sed "s/^/$tag tables /"
echo "$tag $(( $(date +%s) - T0 ))s"
