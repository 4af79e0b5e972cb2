set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/data/.gen_done ] || { python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 32 --weights files 2>&1 | tail -1 | cut -c1-200; touch /tmp/data/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
M="--root /tmp/data --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
timeout 330 python3 benchmarks/bench_gpu.py $M --out /tmp/f --phases default,multi --gpus 1,2,4 > $OUT/f.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/new_multi.json; echo "new multi $(( $(date +%s) - T0 ))s"
PYTHONPATH=/tmp/site:$PWD/.device_carry/old timeout 150 python3 .device_carry/old/benchmarks/bench_gpu.py $M --out /tmp/g --phases multi --gpus 1,4 > $OUT/g.log 2>&1; cp /tmp/g/bench_gpu.json $OUT/old_multi.json; echo "old multi $(( $(date +%s) - T0 ))s"
for g in 1 2 4; do python3 .device_carry/exp/cmp.py /tmp/f/default /tmp/f/multi_$g | head -c 300; echo; done
python3 .device_carry/exp/cmp.py /tmp/f/default /tmp/g/multi_4 | head -c 300; echo
python3 - <<'P'
import json, os
for f in ("new_multi", "old_multi"):
    try: d=json.load(open(f"{os.environ['OUT']}/{f}.json"))
    except Exception as e: print(f, e); continue
    print(f, d.get("errors"))
    x=d.get("default")
    if x: print(" default", {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","passes_per_s"]})
    for g in (1,2,4):
        m=d.get(f"multi_{g}")
        if m: print(" ", g, {k:m.get(k) for k in ["wall_seconds","infer_wall_seconds","after_inference_seconds","speedup","infer_speedup","baseline","returncode"]}, [(r.get("startup_seconds"), r["wall_seconds"], r["build_seconds"]) for r in m["ranks"]])
P
