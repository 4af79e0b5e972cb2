# round 16, call D (one H200, 16 cores): b4b083a (new: lead dataset, the next dataset decoded before every network is built, one build thread) against dd90f41 (old), scale 0.2, cold then warm, new old old new
set -u
END=440
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD; do (cd $P && PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]; import xbench; print(xbench.__file__)" 2>&1 | tail -1); done
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -d /tmp/s0.2/manifests ] || timeout 150 python3 benchmarks/bench_gpu.py --root /tmp/s0.2 --out /tmp/sgen --phases none --scale 0.2 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
for a in "a new" "b old" "c old" "d new"; do set -- $a; L=$(left); if [ $L -gt 90 ]; then bash .device_carry/exp/r16e.sh $1 $2 0.2 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/b/default | cut -c1-400
python3 .device_carry/exp/cmp.py /tmp/a/cached /tmp/d/default | cut -c1-400
(cd $OUT && tar czf run_logs.tgz *_run_log_*.json && rm -f *_run_log_*.json)
echo "done $(( $(date +%s) - T0 ))s"
