# round 16, call C (one H200, 16 cores): this round's code (new: lead dataset, builds in 3 threads, next dataset decoded before every network is built) against dd90f41 (old), scale 0.25, cold then warm, new old old new
set -u
END=500
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD $PWD/.device_carry/old; do (cd $P && PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]; import xbench; print(xbench.__file__)" 2>&1 | tail -1); done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -d /tmp/s0.25/manifests ] || timeout 150 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --out /tmp/sgen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
for a in "a new" "b old" "c old" "d new"; do set -- $a; L=$(left); if [ $L -gt 90 ]; then bash .device_carry/exp/r16e.sh $1 $2 0.25 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/b/default | cut -c1-400
python3 .device_carry/exp/cmp.py /tmp/a/cached /tmp/d/default | cut -c1-400
echo "done $(( $(date +%s) - T0 ))s"
