set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/data/.gen_done ] || { python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; touch /tmp/data/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
timeout 120 python3 benchmarks/bench_gpu.py $B --phases default --out /tmp/n0 > /tmp/n0.log 2>&1; cp /tmp/n0/bench_gpu.json $OUT/n0.json; echo "n0 $(( $(date +%s) - T0 ))s"
for n in o1 n1 o2 n2; do
  mkdir -p /tmp/$n; ln -s /tmp/n0/cache /tmp/$n/cache
  if [ ${n:0:1} = o ]; then PYTHONPATH=/tmp/site:$PWD/.device_carry/old timeout 100 python3 .device_carry/old/benchmarks/bench_gpu.py $B --phases cached --out /tmp/$n > /tmp/$n.log 2>&1
  else timeout 100 python3 benchmarks/bench_gpu.py $B --phases cached --out /tmp/$n > /tmp/$n.log 2>&1; fi
  cp /tmp/$n/bench_gpu.json $OUT/$n.json; tail -2 /tmp/$n.log | cut -c1-300; echo "$n $(( $(date +%s) - T0 ))s"
done
for pair in "o1/cached n1/cached" "n0/default n2/cached" "o2/cached n2/cached"; do set -- $pair; python3 .device_carry/exp/cmp.py /tmp/$1 /tmp/$2 | head -c 330; echo; done
python3 - <<'P'
import json, os
for f in ["n0","o1","n1","o2","n2"]:
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    for ph in ("default", "cached"):
        x=d.get(ph)
        if not x: continue
        print(f, ph, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}); print("  ", x.get("decode_profile"))
    print(d.get("errors"))
P
