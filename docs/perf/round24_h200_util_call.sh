# round 16, call B (one H200): where the GPU idles. HEAD cold then warm at scale 0.25, GPU utilisation sampled every 100 ms; run logs kept
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 150 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --out /tmp/sgen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 100 > $OUT/util.csv &
SMI=$!
date +%s.%N > $OUT/t_start
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --scale 0.25 --bootstrap 1000 --workers 16 --weights files --out /tmp/u --phases default,cached > /tmp/u.log 2>&1
date +%s.%N > $OUT/t_end
kill $SMI
cp /tmp/u/bench_gpu.json $OUT/u.json; cp /tmp/u/default/run_log.json $OUT/run_log_cold.json; cp /tmp/u/cached/run_log.json $OUT/run_log_warm.json
cp /tmp/u/default/evaluation_timing.json $OUT/eval_cold.json; cp /tmp/u/cached/evaluation_timing.json $OUT/eval_warm.json
grep -i "phase\|error" /tmp/u.log | tail -5 | cut -c1-300
python3 - $OUT/u.json <<'P'
import json,sys
d=json.load(open(sys.argv[1]))
for ph in ("default","cached"):
    m=d.get(ph,{}); print(ph, {k:m.get(k) for k in ["whole_seconds","infer_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s","build_seconds"]})
    print("  built", m.get("built_since_start"))
P
echo "done $(( $(date +%s) - T0 ))s"
