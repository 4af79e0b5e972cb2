# As run on the device (round 12). There .device_carry/exp/r12m.sh = round20_x4_arm.sh, .device_carry/exp/cmp.py = round12_cmp_stores.py,
# .device_carry/old = git archive 43f6b62 xbench benchmarks, .device_carry/wheels = the wheels named in docs/performance.md.
# round 12, call A (4-GPU host): install, generate the full-scale stand-ins, new code with 1 and 4 GPUs
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; T0=$(date +%s)
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/full/.gen_done ] || { timeout 300 python3 benchmarks/bench_gpu.py --root /tmp/full --out /tmp/fgen --phases none --scale 1.0 --gen-workers 60 --weights files 2>&1 | tail -2 | cut -c1-300 && touch /tmp/full/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
bash .device_carry/exp/r12m.sh n14 new 1,4 $(( 580 - ($(date +%s) - T0) ))
echo "done $(( $(date +%s) - T0 ))s"
