export PYTHONPATH=$PWD
bash .fa4a/fa4-wheels.sh stage
PSA_FA2_PTXAS_VERBOSE=1 python3 setup.py build_ext --inplace > /tmp/build_full.log 2>&1 || tail -30 /tmp/build_full.log
python3 - <<'PY' > $OUT/registers_32x64.txt
import re
lines = open("/tmp/build_full.log").read().splitlines()
fn = None
for i, l in enumerate(lines):
    m = re.search(r"Compiling entry function '(\S+)' for '(sm_\w+)'", l)
    if m: fn = (m.group(1), m.group(2)); continue
    m = re.search(r"Used (\d+) registers", l)
    if m and fn and ("Li32ELi64E" in fn[0]):
        spill = lines[i-1].strip() if "spill" in lines[i-1] else ""
        print(fn[1], fn[0], "registers", m.group(1), "|", spill)
        fn = None
PY
wc -l < $OUT/registers_32x64.txt
python3 -m pytest -q -p no:cacheprovider tests/test_fast_kernels.py -k "forward or hopper" 2>&1 | tail -2 > $OUT/pytest.txt
python3 -m pytest -q -p no:cacheprovider tests/test_attention.py 2>&1 | tail -2 >> $OUT/pytest.txt
cat $OUT/pytest.txt
python3 bench/fwd_kernels.py --dtypes bf16 fp16 --layouts cf > $OUT/fwd_kernels.md 2>&1
cat $OUT/fwd_kernels.md
