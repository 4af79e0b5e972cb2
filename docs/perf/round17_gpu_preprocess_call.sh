set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import PIL, torch, numpy; print(PIL.__version__, torch.__version__, numpy.__version__)"
XBENCH_TEST_DEVICE=cuda XBENCH_SHARED=$PWD/.device_carry/shared timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_preprocess.py tests/test_pinned_slots.py 2>&1 | tail -3
echo "tests $(( $(date +%s) - T0 ))s"
timeout 330 python3 benchmarks/bench_gpu_preprocess.py --cases 10000 --workers 16 --device cuda --budget 300 --samples .device_carry/shared/samples/*.png --out $OUT/bench_gpu_preprocess.json 2>&1 | tail -4
echo "bench $(( $(date +%s) - T0 ))s"
