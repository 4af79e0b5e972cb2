set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 .device_carry/exp/pin_probe.py 2>&1 | tail -20
python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/data/.gen_done ] || { python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; touch /tmp/data/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
du -sh /tmp/data; python3 - <<'P'
import os, collections
from PIL import Image
c = collections.Counter()
for root, _, files in os.walk('/tmp/data'):
    for f in files[:3]:
        p = os.path.join(root, f)
        if f.endswith(('.png', '.jpg', '.jpeg')):
            try: im = Image.open(p); c[(root.split('/')[3], im.size, im.mode)] += 1
            except Exception: pass
        elif f.endswith('.dcm'):
            import pydicom; d = pydicom.dcmread(p, stop_before_pixels=True); c[(root.split('/')[3], (d.Rows, d.Columns), d.BitsAllocated)] += 1
print(sorted(c.items())[:40])
P
B="--root /tmp/data --phases default,cached --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
for n in n1 n2; do timeout 150 python3 benchmarks/bench_gpu.py $B --out /tmp/$n > /tmp/$n.log 2>&1; cp /tmp/$n/bench_gpu.json $OUT/$n.json; echo "$n $(( $(date +%s) - T0 ))s"; done
timeout 120 py-spy record --rate 50 --idle --threads --format raw -o /tmp/prof.txt -- python3 benchmarks/bench_gpu.py --root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights files --out /tmp/p > /dev/null 2>&1; gzip -c /tmp/prof.txt > $OUT/profidle.txt.gz; echo "prof $(( $(date +%s) - T0 ))s"
python3 - <<'P'
import json, os
for f in ["n1","n2"]:
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    for ph in ("default", "cached"):
        x=d.get(ph,{}); print(f, ph, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}); print("  ", x.get("decode_profile"))
P
