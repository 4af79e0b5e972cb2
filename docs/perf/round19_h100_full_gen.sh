# As run on the device (round 11). There .device_carry/exp/r11arm.sh = round19_h100_arm.sh, .device_carry/exp/cmp.py = round12_cmp_stores.py,
# .device_carry/old = git archive d369478 xbench benchmarks, .device_carry/wheels = the wheels named in docs/performance.md.
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; grep -c sha_ni /proc/cpuinfo; T0=$(date +%s)
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/full/.gen_done ] || { timeout 480 python3 benchmarks/bench_gpu.py --root /tmp/full --out /tmp/fgen --phases none --scale 1.0 --gen-workers 16 --weights files 2>&1 | tail -2 | cut -c1-300 && touch /tmp/full/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"; ls /tmp/full; du -sh /tmp/full; df -h /tmp | tail -1
