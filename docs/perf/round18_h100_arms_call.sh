set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
for P in $PWD $PWD/.device_carry/old $PWD/.device_carry/nopre; do PYTHONPATH=/tmp/site:$P python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/data/.gen_done ] || { python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; touch /tmp/data/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
for n in p1 o1 n1 p2 o2 n2; do
  case ${n:0:1} in o) D=$PWD/.device_carry/old;; p) D=$PWD/.device_carry/nopre;; n) D=$PWD;; esac
  PYTHONPATH=/tmp/site:$D timeout 130 python3 $D/benchmarks/bench_gpu.py $B --out /tmp/$n > /tmp/$n.log 2>&1
  cp /tmp/$n/bench_gpu.json $OUT/$n.json; tail -2 /tmp/$n.log | cut -c1-300; echo "$n $(( $(date +%s) - T0 ))s"
done
for pair in "o1 n1" "p1 n1" "o2 n2" "p2 n2"; do set -- $pair; python3 .device_carry/exp/cmp.py /tmp/$1/default /tmp/$2/default | head -c 300; echo; done
python3 - <<'P'
import json, os
for f in ["p1","o1","n1","p2","o2","n2"]:
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    x=d.get("default",{}); print(f, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}); print("  ", x.get("decode_profile"))
P
E=$(( $(date +%s) - T0 )); echo "elapsed $E"
if [ $E -lt 450 ]; then
  timeout 110 py-spy record --rate 50 --idle --threads --format raw -o /tmp/prof.txt -- python3 benchmarks/bench_gpu.py $B --out /tmp/n3 > /tmp/n3.log 2>&1
  gzip -c /tmp/prof.txt > $OUT/n3_profile.txt.gz; cp /tmp/n3/bench_gpu.json $OUT/n3.json 2>/dev/null; ls -la $OUT; echo "profile $(( $(date +%s) - T0 ))s"
fi
