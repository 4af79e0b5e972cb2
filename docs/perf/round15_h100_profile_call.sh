set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen+weights $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
timeout 130 py-spy record --rate 40 --idle --threads --format raw -o /tmp/prof.txt -- python3 benchmarks/bench_gpu.py $B --out /tmp/p > /dev/null 2>&1; echo "prof $(( $(date +%s) - T0 ))s"
gzip -c /tmp/prof.txt > $OUT/prof.txt.gz; cp /tmp/p/bench_gpu.json $OUT/p.json; cp /tmp/p/default/run_log.json $OUT/p_run_log.json
python3 -c "
import json; x=json.load(open('/tmp/p/bench_gpu.json'))['default']; print({k:x.get(k) for k in ['whole_seconds','infer_seconds','eval_seconds','build_seconds','decode_seconds','passes_per_s','gpu_alone_passes_per_s']}, x.get('decode_profile'))"
