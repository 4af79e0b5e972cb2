# As run on the device (code 43f6b62; output: whole_run_full_1xh200_cold.json).
# 4 x H200 host: install, generate the full-scale stand-ins, one-GPU cold default run (the identity reference)
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; grep -c sha_ni /proc/cpuinfo; T0=$(date +%s)
python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/full/.gen_done ] || { timeout 330 python3 benchmarks/bench_gpu.py --root /tmp/full --out /tmp/fgen --phases none --scale 1.0 --gen-workers 60 --weights files 2>&1 | tail -2 | cut -c1-300 && touch /tmp/full/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"; du -sh /tmp/full; df -h /tmp | tail -1
B="--root /tmp/full --scale 1.0 --bootstrap 1000 --workers 16 --weights files"
timeout $(( 575 - ($(date +%s) - T0) )) python3 benchmarks/bench_gpu.py $B --out /tmp/f --phases default > $OUT/default.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/default.json
python3 - <<'P'
import json, os
d=json.load(open(os.environ['OUT']+"/default.json")); x=d.get("default") or {}
print({k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","passes_per_s","gpu_alone_passes_per_s","store_mb"]}, d.get("errors"))
P
echo "done $(( $(date +%s) - T0 ))s"
