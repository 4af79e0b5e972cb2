# round 13, the one call (4-GPU host, 485 s of device time left): stand-ins at scale 0.5, this round's code and
# 7e9ab1e (old) with 4 GPUs, then the evaluation alone of the new 4-GPU store with each code (64 workers)
set -u
S=0.5; END=430
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 160 python3 benchmarks/bench_gpu.py --root /tmp/s$S --out /tmp/sgen --phases none --scale $S --gen-workers 60 --weights files 2>&1 | tail -2 | cut -c1-300
echo "gen+weights $(( $(date +%s) - T0 ))s"
bash .device_carry/exp/r13m.sh n4 new 4 $S $(( $(left) - 150 ))
bash .device_carry/exp/r13m.sh o4 old 4 $S $(( $(left) - 70 ))
export XBENCH_MANIFESTS=/tmp/s$S/manifests PYTHONWARNINGS=ignore
for C in new old; do
  D=$PWD; [ $C = old ] && D=$PWD/.device_carry/old
  L=$(left); [ $L -lt 15 ] && { echo "skip eval $C"; continue; }
  PYTHONPATH=/tmp/site:$D timeout $(( L / 2 + 5 )) python3 .device_carry/exp/evalarm.py /tmp/n4/multi_4.yaml /tmp/ev_$C 64 $OUT/eval_${C}_64.json 2>&1 | tail -2 | cut -c1-700
  echo "eval $C $(( $(date +%s) - T0 ))s"
done
sha256sum /tmp/n4/multi_4/tables/*.csv /tmp/n4/multi_4/tables/*.json /tmp/o4/multi_4/tables/*.csv /tmp/o4/multi_4/tables/*.json /tmp/ev_*/tables/*.csv /tmp/ev_*/tables/*.json 2>/dev/null | sed 's#/tmp/##' > $OUT/tables.sha
python3 .device_carry/exp/cmp.py /tmp/n4/multi_4 /tmp/o4/multi_4 2>&1 | tail -1 | cut -c1-600
echo "done $(( $(date +%s) - T0 ))s"
