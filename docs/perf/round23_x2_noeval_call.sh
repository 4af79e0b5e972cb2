# round 15, call A (2-GPU host): does rank 0's evaluation make it the slowest rank? 2-GPU runs of this code, scale 0.5, with and without --no-eval, E N N E
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2; T0=$(date +%s)
python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s0.5 --out /tmp/sgen --phases none --scale 0.5 --gen-workers 30 --weights files 2>&1 | tail -2 | cut -c1-300
echo "gen $(( $(date +%s) - T0 ))s"; du -sh /tmp/s0.5
for a in "e1 eval" "n1 noeval" "n2 noeval" "e2 eval"; do set -- $a; timeout 120 python3 .device_carry/exp/r15arm.py /tmp/s0.5 $1 $2 2 | python3 -c "
import json,sys; r=json.loads(sys.stdin.read()); print(r['tag'], r['mode'], 'rc', r['rc'], 'wall', r['wall'], [(x.get('startup_seconds'), x['wall_seconds'], x['build_seconds'], x['model_seconds'], x['decode_wait_seconds'], x['cases']) for x in r['ranks']]); print(r.get('stderr','')[-1500:])"; echo "t $(( $(date +%s) - T0 ))s"; done
