export PYTHONPATH=$PWD PSA_FA2_COMMIT=100c332
bash .fa4b/fa4-wheels.sh install > /tmp/fa4_install.log 2>&1 && source /tmp/fa4-env.sh || tail -5 /tmp/fa4_install.log
python3 -c "import flash_attn.cute; print('fa4 ok')"
python3 bench/bench_attention.py --dtypes bf16 --budget-s 240 --out $OUT/h200-bf16 > /tmp/bench_bf16.log 2>&1; tail -25 $OUT/h200-bf16.md
python3 bench/bench_attention.py --quick --no-step --dtypes fp16 --peers ours eager sdpa sdpa_cudnn sdpa_efficient flex fa4 --shapes 16x4x400 16x4x1600 8x4x6400 1x2x62500 --budget-s 120 --out $OUT/h200-fp16 > /tmp/bench_fp16.log 2>&1; tail -12 $OUT/h200-fp16.md
python3 bench/plots.py --attention $OUT/h200-bf16.json --out $OUT > /dev/null 2>&1; ls $OUT
