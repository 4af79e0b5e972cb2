set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/full/.gen_done ] || { timeout 520 python3 benchmarks/bench_gpu.py --root /tmp/full --out /tmp/fgen --phases none --scale 1.0 --gen-workers 16 --weights files 2>&1 | tail -2 | cut -c1-300 && touch /tmp/full/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"; ls /tmp/full; du -sh /tmp/full
