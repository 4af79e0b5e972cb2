set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -2
echo "warm-up $(( $(date +%s) - T0 ))s"
python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -2 | cut -c1-300
echo "gen+weights $(( $(date +%s) - T0 ))s"
for arm in r1:random f1:files r2:random f2:files; do n=${arm%%:*}; w=${arm##*:}
  timeout 130 python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/$n --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights $w > $OUT/$n.log 2>&1; cp /tmp/$n/bench_gpu.json $OUT/$n.json; echo "$n $(( $(date +%s) - T0 ))s"
done
if [ $(( $(date +%s) - T0 )) -lt 430 ]; then timeout 120 py-spy record --rate 40 --idle --threads --format raw -o /tmp/prof.txt -- python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/p --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights files > $OUT/p.log 2>&1; gzip -c /tmp/prof.txt > $OUT/prof.txt.gz; cp /tmp/p/bench_gpu.json $OUT/p.json; echo "prof $(( $(date +%s) - T0 ))s"; fi
for n in r1 f1 r2 f2; do cp /tmp/$n/default/run_log.json $OUT/runlog_$n.json; done
python3 .device_carry/exp/cmp.py /tmp/r1/default /tmp/r2/default | head -c 300; echo
python3 .device_carry/exp/cmp.py /tmp/f1/default /tmp/f2/default | head -c 300; echo
python3 - <<'P'
import json, os
for f in ["r1","f1","r2","f2"]:
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    x=d.get("default",{}); print(f, d["environment"].get("bytecode"), {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}, d.get("errors"))
P
