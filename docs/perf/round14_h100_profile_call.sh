set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
nvidia-smi -L; nproc; T0=$(date +%s); lscpu | grep "Model name"
python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16"
PYTHONPATH=/tmp/site:$PWD/.device_carry/old timeout 130 python3 .device_carry/old/benchmarks/bench_gpu.py $B --out /tmp/o > $OUT/o.log 2>&1; echo "old $(( $(date +%s) - T0 ))s"
timeout 130 python3 benchmarks/bench_gpu.py $B --out /tmp/n > $OUT/n.log 2>&1; echo "new $(( $(date +%s) - T0 ))s"
timeout 150 py-spy record --rate 40 --idle --threads --format raw -o /tmp/prof.txt -- python3 benchmarks/bench_gpu.py $B --out /tmp/p > $OUT/p.log 2>&1; echo "prof $(( $(date +%s) - T0 ))s"
mkdir -p /tmp/r; for d in o n p; do cp /tmp/$d/bench_gpu.json /tmp/r/$d.json; cp /tmp/$d/default/run_log*.json /tmp/r/ 2>/dev/null && mv /tmp/r/run_log.json /tmp/r/runlog_$d.json; done
python3 .device_carry/exp/cmp.py /tmp/o/default /tmp/n/default > /tmp/r/cmp_on.json; head -c 300 /tmp/r/cmp_on.json; echo
gzip -c /tmp/prof.txt > $OUT/prof.txt.gz; tar czf $OUT/r.tgz -C /tmp r
python3 - <<'P'
import json
for f in "onp":
    try: d=json.load(open(f"/tmp/r/{f}.json"))
    except Exception as e: print(f, e); continue
    x=d.get("default",{}); print(f, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}, d.get("errors"))
P
