# One H200, 16 cores (outputs: whole_run_half_1xh200*.json, decode_stage_alone_half_1xh200.txt): the bounds of a cold run on this host (decode stage alone, GPU alone, whole cold and warm), and where a warm run's start goes (a fresh process, py-spy)
# (run as .device_carry/exp/r19a.sh from the checkout of b8ece99, wheels in .device_carry/wheels: open_clip_torch 3.3.0, ftfy 6.3.1, wcwidth 0.9.4, pydicom 3.0.2, zstandard 0.25.0, pycocotools 2.0.11, py-spy 0.4.3)
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log --oneline | head -1; git diff --stat | tail -1; T0=$(date +%s)
S=0.5
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s$S --out /tmp/sgen --phases none --scale $S --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s"
B="--root /tmp/s$S --scale $S --bootstrap 1000 --workers 16 --weights files"
# 1. whole runs, cold then warm, one process 
timeout 170 python3 benchmarks/bench_gpu.py $B --out /tmp/a --phases default,cached > /tmp/a.log 2>&1; cp /tmp/a/bench_gpu.json $OUT/r19a_whole.json
python3 - /tmp/a/bench_gpu.json <<'P'
import json, sys
d=json.load(open(sys.argv[1]))
for ph in ("default","cached"):
    m=d.get(ph) or {}
    print(ph, {k: m.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","build_seconds"]})
    print("  built", m.get("built_since_start")); print("  model s", {k: v["seconds"] for k, v in (m.get("per_model") or {}).items()})
P
echo "whole $(( $(date +%s) - T0 ))s"
# 2. the decode stage alone, cold decode cache, 16 workers, GPU preprocessing
timeout 120 python3 benchmarks/bench_decode.py --root /tmp/s$S --workers 16 --device cuda --cache-dir /tmp/dc > $OUT/r19a_decode_alone.txt 2>&1; tail -1 $OUT/r19a_decode_alone.txt | cut -c1-400
echo "decode $(( $(date +%s) - T0 ))s"
# 3. a warm run in a fresh process (the decode cache of 1), plainly, then under py-spy
rm -rf /tmp/a/cached; timeout 80 python3 benchmarks/bench_gpu.py $B --out /tmp/a --phases cached > /tmp/w0.log 2>&1; cp /tmp/a/bench_gpu.json $OUT/r19a_warm_fresh_plain.json
python3 -c "import json;m=json.load(open('/tmp/a/bench_gpu.json'))['cached'];print('warm fresh plain', m['whole_seconds'], m['infer_seconds'], m['passes_per_s'], m['built_since_start'])"
rm -rf /tmp/a/cached; timeout 120 py-spy record --rate 100 --idle --threads -f speedscope -o /tmp/warm.json -- python3 benchmarks/bench_gpu.py $B --out /tmp/a --phases cached > /tmp/w1.log 2>&1; echo "py-spy rc $?"
python3 -c "import json;m=json.load(open('/tmp/a/bench_gpu.json'))['cached'];print('warm fresh profiled', m['whole_seconds'], m['infer_seconds'], m['passes_per_s'], m['built_since_start'])"
cp /tmp/a/bench_gpu.json $OUT/r19a_warm_fresh_profiled.json; gzip -c /tmp/warm.json > $OUT/r19a_warm.speedscope.json.gz
mkdir -p /tmp/logs; cp /tmp/a/default/run_log.json /tmp/logs/cold_run_log.json; cp /tmp/a/cached/run_log.json /tmp/logs/warm_profiled_run_log.json; cp /tmp/*.log /tmp/logs/; tar czf $OUT/r19a_logs.tgz -C /tmp logs
ls -la $OUT; echo "done $(( $(date +%s) - T0 ))s"
