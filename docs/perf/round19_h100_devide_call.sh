# As run on the device (round 11). There .device_carry/exp/r11arm.sh = round19_h100_arm.sh, .device_carry/exp/cmp.py = round12_cmp_stores.py,
# .device_carry/old = git archive d369478 xbench benchmarks, .device_carry/wheels = the wheels named in docs/performance.md.
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; T0=$(date +%s)
for P in $PWD $PWD/.device_carry/old; do PYTHONPATH=/tmp/site:$P python3 -c "import zstandard, torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1; done
echo "warm-up $(( $(date +%s) - T0 ))s"
PYTHONPATH=/tmp/site:$PWD python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --scale 0.25 --bootstrap 1000 --workers 16 --weights files --out /tmp/f"
for a in "n_cold new default" "n_warm1 new cached" "o_warm1 old cached" "n_warm2 new cached" "o_warm2 old cached"; do
  set -- $a; tag=$1; D=$PWD; [ $2 = old ] && D=$PWD/.device_carry/old
  PYTHONPATH=/tmp/site:$D timeout 150 python3 $D/benchmarks/bench_gpu.py $B --phases $3 > /tmp/$tag.log 2>&1; cp /tmp/f/bench_gpu.json $OUT/$tag.json
  rm -rf /tmp/keep_$tag; mv /tmp/f/$([ $3 = cached ] && echo cached || echo default) /tmp/keep_$tag
  python3 - "$OUT/$tag.json" "$3" "$tag" <<'P'
import json, sys
d=json.load(open(sys.argv[1])); x=d.get(sys.argv[2]) or {}
print(sys.argv[3], {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","passes_per_s","gpu_alone_passes_per_s"]}, {m: v.get("seconds") for m, v in (x.get("per_model") or {}).items()}, d.get("errors"))
P
  echo "$tag $(( $(date +%s) - T0 ))s"
done
for pair in "n_warm1 o_warm1" "n_warm2 o_warm2" "n_cold n_warm1"; do set -- $pair; python3 .device_carry/exp/cmp.py /tmp/keep_$1 /tmp/keep_$2 | head -c 330; echo; done
