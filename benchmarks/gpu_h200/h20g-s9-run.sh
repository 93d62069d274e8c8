#!/bin/bash
# Session 9 (issue 20, H20G): one device call = install + the steps named on the command line,
# each under its own time limit, each step's full log under $OUT, a short tail on stdout.
#   bash benchmarks/gpu_h200/h20g-s9-run.sh STEP[:SECONDS] ...
set -u
cd "$(dirname "$0")/../.."
T0=$SECONDS
export PYTHONUNBUFFERED=1
{
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c 'import torch, triton, cupy, transformers, peft; print(torch.__version__, triton.__version__, cupy.__version__, transformers.__version__, peft.__version__, torch.cuda.get_device_name())'
} > "$OUT/env.txt" 2>&1
echo "install rc=$? t=$((SECONDS - T0)) s"; tail -n 3 "$OUT/env.txt"
run() {  # name limit command...
  local name=$1 lim=$2; shift 2
  echo "== $name (limit $lim s, t=$((SECONDS - T0)) s)"
  timeout -k 5 "$lim" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? t=$((SECONDS - T0)) s"
}
for arg in "$@"; do
  name=${arg%%:*}; lim=${arg#*:}; [ "$lim" = "$arg" ] && lim=300
  [ "$lim" = rest ] && lim=$((575 - (SECONDS - T0)))  # what is left of the call's 600 s
  case $name in
    fp8tests) run fp8tests "$lim" python3 -m pytest -q -rA -m gpu tests/train/test_fused_gpu.py -p no:cacheprovider
              grep -E "PASS|FAIL|XFAIL|XPASS|ERROR|passed|failed|Error|assert" "$OUT/fp8tests.log" | tail -n 25 ;;
    gputests) run gputests "$lim" python3 -m pytest -q -rfEX -m gpu tests/plan/test_gpu_plan.py tests/kernels/test_kernels_gpu.py tests/image/test_cuda_decode.py -p no:cacheprovider
              grep -E "FAIL|XPASS|ERROR|passed|failed" "$OUT/gputests.log" | tail -n 15 ;;
    kernels) run kernels "$lim" python3 benchmarks/kernels/bench_strongest.py --shapes 8192x8192,14336x4096 --method graph --rounds 3 --out "$OUT"
             grep -E "^1x|^  torch" "$OUT/kernels.log" | cut -c1-150; sed -n '/^summary/,$p' "$OUT/kernels.log" | cut -c1-260 ;;
    decode) run decode "$lim" python3 benchmarks/bench_decode.py --models 7b --reps 3 --no-torch-step --deadline 0 --out "$OUT"
            grep -E "tok/s|realizations|steps|hf-generate" "$OUT/decode.log" | cut -c1-400 | tail -n 12 ;;
    ktests) run ktests "$lim" python3 -m pytest -q -rfEX -m gpu tests/kernels/test_kernels_gpu.py tests/image/test_cuda_decode.py -p no:cacheprovider
            grep -E "FAIL|XPASS|ERROR|passed|failed" "$OUT/ktests.log" | cut -c1-300 | tail -n 15 ;;
    ncu) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
         run ncu "$lim" "$NCU" --clock-control none --kernel-name regex:decode_linear_x16 --launch-count 12 \
             --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
             python3 benchmarks/kernels/ncu_probe.py linear-q4b32p-x16:8192x8192:8,1,2,0 linear-q4b32p-x16:8192x8192:4,1,1,4 \
             linear-q4b32p-x16:8192x8192:4,2,1,4 linear-int8-x16:14336x4096:4,2,2,0 linear-int8-x16:14336x4096:4,2,1,4 \
             linear-q4b32p-x16:14336x4096:4,1,2,3
         grep -E "decode_linear_x16<|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Warp Cycles Per Issued|Issue Slots Busy" "$OUT/ncu.log" | cut -c1-150 | tail -n 70 ;;
    train1|train2)  # the alternate part, one base a process (two bases in one process hit dynamo's recompile limit, session 7)
        base=$([ "$name" = train1 ] && echo random-0.02 || echo smollm2-shape)
        mkdir -p "$OUT/$name"
        run "$name" "$lim" python3 benchmarks/bench_train_gpu_ledger.py --parts alternate --bases "$base" --steps 22 \
            --loops "autocast-compile,fused-lora (in process),fp8-base (in process)" --out "$OUT/$name"
        grep -E "set up in|\] loop|\] [a-z0-9-]+ .*[0-9]+ +[0-9.]+ +[0-9.]+%|FAILED|done in" "$OUT/$name.log" | cut -c1-420 | tail -n 12 ;;
    kborder) run kborder "$lim" python3 benchmarks/kernels/bench_strongest.py --shapes 8192x8192,14336x4096 --method graph --rounds 5 \
                 --only lora-linear-bf16,linear-int8-x16 --out "$OUT"
             sed -n '/^summary/,$p' "$OUT/kborder.log" | cut -c1-260 ;;
    *) echo "unknown step $name" ;;
  esac
done
echo "total t=$((SECONDS - T0)) s"
