set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl .device_carry/tools/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import torch, torchvision, transformers, open_clip, timm, pydicom, PIL, scipy, sklearn, pandas, xbench.cli, xbench.workflows.run; from xbench.models.base import input_twin; [input_twin(m) for m in ['clip','medklip','kad','mavl','carzero','devide']]" 2>&1 | tail -1
echo "warm-up $(( $(date +%s) - T0 ))s"
[ -f /tmp/data/.gen_done ] || { python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; touch /tmp/data/.gen_done; }
echo "gen+weights $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
timeout 120 py-spy record --rate 50 --gil --threads --format raw -o /tmp/gil.txt -- python3 benchmarks/bench_gpu.py $B --out /tmp/pg > /dev/null 2>&1; gzip -c /tmp/gil.txt > $OUT/gil.txt.gz; cp /tmp/pg/bench_gpu.json $OUT/pg.json; echo "gil $(( $(date +%s) - T0 ))s"
timeout 120 py-spy record --rate 50 --idle --threads --native --format raw -o /tmp/idle.txt -- python3 benchmarks/bench_gpu.py $B --out /tmp/pi > /dev/null 2>&1; gzip -c /tmp/idle.txt > $OUT/idle.txt.gz; cp /tmp/pi/bench_gpu.json $OUT/pi.json; echo "idle $(( $(date +%s) - T0 ))s"
ls -la $OUT
