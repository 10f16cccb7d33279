#!/usr/bin/env bash
# The profiling jobs of the workflow (growlm.profiling.workload under growlm.profiling) for a d1 = 768
# configuration, without Snakemake: a small member (d0 = 384, 6 layers), M_0 (768, 12 layers) and
# M'_1 during refinement ([concat, zero_block] of two fresh members), each under Nsight Compute
# and torch.profiler (Nsight Systems is tried first and falls back where it does not work).
#   PYTHONPATH=workflow/scripts bash bench/gpu_profile.sh OUT_DIR
set -u
OUT=${1:?output folder}
W="python3 -m growlm.profiling.workload --train bench/profile_gpu_train.json --model bench/profile_gpu_model.json"
W="$W --vocab 4096 --tokens random:2000000 --steps 10 --threads 4"
run() {  # tool kind width depth [extra]
    timeout 150 python3 -m growlm.profiling "$1" "$OUT/$1_$2" --steps 3 --warmup 4 \
        --kernel-filter "regex:gemm|nvjet|sm90|flash|sdpa|cutlass" --launch-count 12 \
        -- $W --kind "$2" --width "$3" --depth "$4" ${5:-} > "$OUT/$1_$2.log" 2>&1
    echo "$1 $2: exit $?"
}
run ncu small 384 6
run ncu baseline 768 12
run ncu refine 768 12 "--random-members concat+zero_block:2:384:6"
run torch small 384 6
run torch baseline 768 12
run torch refine 768 12 "--random-members concat+zero_block:2:384:6"
run nsys baseline 768 12
