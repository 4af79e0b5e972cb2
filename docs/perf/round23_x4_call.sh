# round 15, call C (4-GPU host): f1bbb28 (new) against 7dcc040 (old), each arm from its own tree; 4 GPUs new old old new at scale 0.5, then new on 1 and 2 GPUs (speed-ups on this host)
set -u
END=585
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD $PWD/.device_carry/old; do (cd $P && PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]; import xbench; print(xbench.__file__)" 2>&1 | tail -1); done
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s0.5 --out /tmp/sgen --phases none --scale 0.5 --gen-workers 60 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
for a in "a new" "b old" "c old" "d new"; do set -- $a; L=$(left); if [ $L -gt 75 ]; then bash .device_carry/exp/r15m.sh $1 $2 4 0.5 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
for a in "e new 1" "f new 2"; do set -- $a; L=$(left); if [ $L -gt 95 ]; then bash .device_carry/exp/r15m.sh $1 $2 $3 0.5 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
for t in a b c d e f; do ls -d /tmp/$t/multi_*/tables >/dev/null 2>&1 && sha256sum /tmp/$t/multi_*/tables/*.csv | awk '{print $1}' | sha256sum | cut -c1-16 | sed "s/^/$t tables /"; done
echo "done $(( $(date +%s) - T0 ))s"
