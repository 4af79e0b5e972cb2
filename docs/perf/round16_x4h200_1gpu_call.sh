set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log -1 --format=%h 2>/dev/null; T0=$(date +%s)
python3 -c "
import threading, torch
torch.cuda.set_device(1); seen = []
t = threading.Thread(target=lambda: seen.append(torch.cuda.current_device())); t.start(); t.join()
print('current device: main thread', torch.cuda.current_device(), 'new thread', seen[0])"
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/data/.gen_done ] || { python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 32 --weights files 2>&1 | tail -1 | cut -c1-200; touch /tmp/data/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
for n in o1 n1 o2 n2; do
  if [ ${n:0:1} = o ]; then PYTHONPATH=/tmp/site:$PWD/.device_carry/old timeout 130 python3 .device_carry/old/benchmarks/bench_gpu.py $B --out /tmp/$n > $OUT/$n.log 2>&1
  else timeout 130 python3 benchmarks/bench_gpu.py $B --out /tmp/$n > $OUT/$n.log 2>&1; fi
  cp /tmp/$n/bench_gpu.json $OUT/$n.json; echo "$n $(( $(date +%s) - T0 ))s"
done
for pair in "o1 n1" "o1 o2" "n1 n2"; do set -- $pair; python3 .device_carry/exp/cmp.py /tmp/$1/default /tmp/$2/default | head -c 330; echo; done
cp /tmp/n2/default/run_log.json $OUT/n2_run_log.json
python3 - <<'P'
import json, os
for f in ["o1","n1","o2","n2"]:
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    x=d.get("default",{}); print(f, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}, x.get("decode_profile"), x.get("built_since_start"), d.get("errors"))
P
