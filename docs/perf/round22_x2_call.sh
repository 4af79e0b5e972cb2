# As run on the device (round 14). .device_carry/exp/r13m.sh = docs/perf/round21_x4_arm.sh, r14m.sh = round22_x2_arm.sh, cmp.py = round12_cmp_stores.py.
# round 14, call D (2-GPU host): stand-ins at scale 0.5; this code (200d458) against 7e9ab1e on 2 GPUs, ABBA, each arm
# run from inside its own tree; tables and stores compared
set -u
S=0.5; END=580
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
for P in $PWD $PWD/.device_carry/old; do (cd $P && PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run, torch.distributed.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]; import xbench; print(xbench.__file__)" 2>&1 | tail -1); done
for P in $PWD $PWD/.device_carry/old; do (cd $P && python3 -c "import xbench.evaluation.steps; print(\"steps present\")" 2>&1 | tail -1); done
echo "warm-up $(( $(date +%s) - T0 ))s"
timeout 250 python3 benchmarks/bench_gpu.py --root /tmp/s$S --out /tmp/sgen --phases none --scale $S --gen-workers 30 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen+weights $(( $(date +%s) - T0 ))s"
for arm in "a new" "b old" "c old" "d new"; do set -- $arm
  L=$(left); [ $L -lt 75 ] && { echo "no time for $1 ($L s)"; break; }
  bash .device_carry/exp/r14m.sh $1 $2 2 $S $(( L - 10 )) 2>&1 | head -3
done
for t in b c d; do [ -d /tmp/$t/multi_2 ] && python3 .device_carry/exp/cmp.py /tmp/a/multi_2 /tmp/$t/multi_2 | cut -c1-300; done
sha256sum /tmp/[abcd]/multi_2/tables/*.csv /tmp/[abcd]/multi_2/tables/*.json 2>/dev/null | sed 's#/tmp/##' > $OUT/tables.sha
python3 - <<'P'
import collections, os
seen = collections.defaultdict(set)
for line in open(os.environ["OUT"] + "/tables.sha"):
    h, p = line.split(); seen[p.split("/", 2)[2]].add(h)
print("tables with one sha256 across runs:", sum(len(v) == 1 for v in seen.values()), "of", len(seen), [k for k, v in seen.items() if len(v) > 1])
P
grep -h "xbench.*__init__\|Traceback" /tmp/[abcd].log | head -5
echo "done $(( $(date +%s) - T0 ))s"
