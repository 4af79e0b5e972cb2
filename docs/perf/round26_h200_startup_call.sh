# round 18, call C (one H200): where a cold run's first seconds go. 0.25 scale, default phase only, under py-spy (all threads, idle included, 100 Hz, speedscope: samples in time order)
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log --oneline | head -1; T0=$(date +%s)
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --out /tmp/sgen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s"
B="--root /tmp/s0.25 --scale 0.25 --bootstrap 1000 --workers 16 --weights files"
timeout 120 python3 benchmarks/bench_gpu.py $B --out /tmp/p0 --phases default > /tmp/p0.log 2>&1; python3 -c "import json;m=json.load(open('/tmp/p0/bench_gpu.json'))['default'];print('plain', m['whole_seconds'], m['infer_seconds'], m['passes_per_s'], m['built_since_start'])"
timeout 200 py-spy record --rate 100 --idle --threads -f speedscope -o /tmp/startup.json -- python3 benchmarks/bench_gpu.py $B --out /tmp/p1 --phases default > /tmp/p1.log 2>&1; echo "py-spy rc $?"
python3 -c "import json;m=json.load(open('/tmp/p1/bench_gpu.json'))['default'];print('profiled', m['whole_seconds'], m['infer_seconds'], m['passes_per_s'], m['built_since_start'])"
cp /tmp/p0/default/run_log.json $OUT/p0_run_log.json; cp /tmp/p1/default/run_log.json $OUT/p1_run_log.json; cp /tmp/p0/bench_gpu.json $OUT/p0.json; cp /tmp/p1/bench_gpu.json $OUT/p1.json
gzip -c /tmp/startup.json > $OUT/startup.speedscope.json.gz; ls -la $OUT; tail -3 /tmp/p1.log | cut -c1-300; echo "done $(( $(date +%s) - T0 ))s"
