set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
# bytecode as a normal install keeps it: writable cache outside the read-only trees, filled once by a warm-up
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -2
echo "warm-up $(( $(date +%s) - T0 ))s"
python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 32 --weights files 2>&1 | tail -2 | cut -c1-300
echo "gen+weights $(( $(date +%s) - T0 ))s"
timeout 420 python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/f --phases default,multi --gpus 1,2,4 --scale 0.25 --bootstrap 1000 --workers 16 --weights files > $OUT/f.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/files_multi.json; echo "files+multi $(( $(date +%s) - T0 ))s"
for g in 1 2 4; do python3 .device_carry/exp/cmp.py /tmp/f/default /tmp/f/multi_$g > $OUT/cmp_m$g.json; head -c 300 $OUT/cmp_m$g.json; echo; done
python3 - <<'P'
import json, os
d=json.load(open(f"{os.environ['OUT']}/files_multi.json"))
print(d.get("environment",{}).get("bytecode"), d.get("weights"), d.get("errors"))
x=d.get("default",{}); print("default", {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]})
for g in (1,2,4):
    m=d.get(f"multi_{g}")
    if m: print(g, {k:m.get(k) for k in ["wall_seconds","infer_wall_seconds","after_inference_seconds","speedup","infer_speedup","baseline","returncode"]}, [(r.get("startup_seconds"), r["wall_seconds"], r["build_seconds"]) for r in m["ranks"]])
P
tail -5 $OUT/f.log | cut -c1-400
