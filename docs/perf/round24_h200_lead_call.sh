# round 16, call A (one H200, 16 cores): the lead dataset (new, HEAD) against dd90f41 (old: largest first), 1 GPU cold at scale 0.5, new old old new
set -u
END=585
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD $PWD/.device_carry/old; do (cd $P && PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]; import xbench; print(xbench.__file__)" 2>&1 | tail -1); done
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 260 python3 benchmarks/bench_gpu.py --root /tmp/s0.5 --out /tmp/sgen --phases none --scale 0.5 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"; du -sh /tmp/s0.5
for a in "a new" "b old" "c old" "d new"; do set -- $a; L=$(left); if [ $L -gt 60 ]; then bash .device_carry/exp/r16d.sh $1 $2 0.5 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
echo "done $(( $(date +%s) - T0 ))s"
