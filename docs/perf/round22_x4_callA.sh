# As run on the device (round 14). .device_carry/exp/r13m.sh = docs/perf/round21_x4_arm.sh, r14m.sh = round22_x2_arm.sh, cmp.py = round12_cmp_stores.py.
# round 14, call A (4-GPU host): install, full-scale stand-ins, this code (3bba382) with torchrun on 1 GPU and on 4 GPUs, cold
set -u
END=575
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 300 python3 benchmarks/bench_gpu.py --root /tmp/s1.0 --out /tmp/sgen --phases none --scale 1.0 --gen-workers 60 --weights files 2>&1 | tail -2 | cut -c1-300
echo "gen+weights $(( $(date +%s) - T0 ))s"; du -sh /tmp/s1.0
bash .device_carry/exp/r13m.sh n1 new 1 1.0 $(( $(left) - 5 ))
L=$(left); if [ $L -gt 110 ]; then bash .device_carry/exp/r13m.sh n4 new 4 1.0 $(( L - 5 )); else echo "no time for n4 ($L s)"; fi
echo "done $(( $(date +%s) - T0 ))s"
