#!/usr/bin/env bash
# Copyright © 2026 Apple Inc.
# The H200 calls of docs/benchmarks.md (issue 32), device side:
#   bash benchmarks/dsv4_gpu_calls.sh <part>
# with PYTHONPATH=/tmp/site (MLX's CUDA build, ../shared/tools/mlx-cuda-parts.sh)
# and, carried in build/gpu/: main/ and b535387/ (`tools/fork.py stage` of
# each tree, tests/ removed) and mlxvlm.tar.xz (mlx_vlm/ of the 0.7.10 wheel).
# Pillow and numpy wheels (cp312) go into .mlxcuda/b/ for mlx-vlm's imports;
# cute.tar.xz (mlx/include/cute and cutlass of the mlx-cuda-13 wheel) for the
# quantized matmuls, which MLX compiles at run time against them.
# ptx.tar.xz (part 10 returns it: /tmp/mlx, the kernels MLX compiled) spares
# a fresh machine that compile.
# A trial on a CPU (each line at small sizes): PY (the python), VLM (mlx_vlm's
# parent folder), EXTRA (arguments after each line's, which override them),
# e.g. for part 6: EXTRA="--tiny --dtype float32 --layers 4 --context 64
# --tokens 8 --repeat 1".
set -u
VLM=${VLM:-/tmp/vlm}
[ -f build/gpu/mlxvlm.tar.xz ] && mkdir -p $VLM && tar -C $VLM -xJf build/gpu/mlxvlm.tar.xz
[ -f build/gpu/cute.tar.xz ] && tar -C /tmp/site -xJf build/gpu/cute.tar.xz
[ -f build/gpu/ptx.tar.xz ] && tar -C /tmp -xJf build/gpu/ptx.tar.xz
# trees.tar.xz: staged trees packed to fit a call's carry (main/, ...).
[ -f build/gpu/trees.tar.xz ] && tar -C build/gpu -xJf build/gpu/trees.tar.xz
# fixed/: main with the step-shapes trial (parts 14 and 16).
if [ -d build/gpu/main ] && [ ! -d build/gpu/fixed ]; then
  cp -r build/gpu/main build/gpu/fixed
  patch -s -p1 -d build/gpu/fixed < benchmarks/trials/dsv4-whole-pool.diff
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
B=benchmarks/dsv4_speed.py
PAT='tok/s|primitives|weights|rc |Error|error'
n=0
run() {  # run <tree> <timeout> <env> args...
  tree=$1; limit=$2; envs=$3; shift 3; n=$((n+1))
  log=$OUT/$(printf %02d $n)-$tree.log
  echo "=== $n $tree [$envs] $* ($(date -u +%T))" | tee $log
  env $envs PYTHONPATH=build/gpu/$tree:$VLM:/tmp/site timeout $limit ${PY:-python3} $B "$@" ${EXTRA:-} >>$log 2>&1
  echo "rc $? ($(date -u +%T))" >>$log
  grep -E "$PAT" $log | grep -v -e '^  ' -e '^===' | tail -40
}
L43="--layers 43 --experts 8"
P="--peer --peer-exact-indexer"
case $1 in
1)
  run main 200 X=1 $L43 --prefill 2048,16384 --decode 1024,32768 --steps 24 $P
  run b535387 200 X=1 $L43 --prefill 2048,16384 --decode 1024,32768 --steps 24 $P
  run b535387 90 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  run main 90 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  ;;
2)
  run main 80 X=1 --experts 8 --prefill 2048,16384 --decode 1024,32768 --steps 64 $P
  run b535387 80 X=1 --experts 8 --prefill 2048,16384 --decode 1024,32768 --steps 64 $P
  run b535387 60 X=1 --experts 8 --bits 4 --prefill 2048,16384 --decode 1024,32768 --steps 64 $P
  run main 60 X=1 --experts 8 --bits 4 --prefill 2048,16384 --decode 1024,32768 --steps 64 $P
  for k in 1 0 0 1; do
    run main 70 MLX_LM_HC_KERNELS=$k $L43 --prefill 2048 --decode 1024 --steps 32
  done
  ;;
3)
  run main 280 X=1 $L43 --prefill 2048,16384 --decode 1024,32768 --steps 24 $P
  run b535387 220 X=1 $L43 --prefill 2048,16384 --decode 1024,32768 --steps 24 $P
  ;;
4)
  run main 150 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  run b535387 120 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  run b535387 70 X=1 --experts 8 --bits 4 --prefill 2048,16384 --decode 1024 --steps 64 $P
  run main 70 X=1 --experts 8 --bits 4 --prefill 2048,16384 --decode 1024 --steps 64 $P
  ;;
5)
  B=benchmarks/dsv4_verify.py
  run main 290 X=1 $L43 --context 1024 --rounds --mtp-k 2 --oracle --tokens 48 --repeat 3
  run main 50 X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 1
  run main 50 X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 3
  ;;
6)
  # Drafting rounds with the real drafters (issue 31), about 500 s at most
  # in all: the MTP rounds at k=1..3 and DSpark's at block 2..5 (random
  # drafters: a round's cost), the oracle at the published acceptance, and
  # mlx-vlm 0.7.10's rounds beside ours. The first process pays the CUDA
  # JIT: a warm-up on 5 layers at the same widths, every path once.
  B=benchmarks/dsv4_verify.py
  PAT='round|step|plain|MTP|DSpark|rc |Error|error|Killed'
  run main 90 X=1 --layers 5 --experts 8 --context 256 --no-verify --rounds --mtp-k 1,2,3 --dspark --peer --oracle --oracle-sets published --tokens 8 --repeat 1
  run main 250 X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 1,2,3 --dspark --oracle --oracle-sets published --tokens 32 --repeat 2
  run main 160 X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 2 --dspark --dspark-blocks 2,5 --peer --tokens 24 --repeat 2
  ;;
7)
  # 4-bit at 43 layers: a 6-layer warm-up process first compiles the
  # quantized matmuls (CUTLASS, at run time; later processes reuse them).
  run main 240 X=1 --experts 8 --bits 4 --prefill 2048 --decode 1024 --steps 16
  run main 110 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  run b535387 110 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  ;;
8)
  # What a verify over L tokens costs on the GPU against the experts it
  # reads: top-6 of 8 (L >= 2 reads up to all 8) against top-8 of 8 (every
  # L reads the same 8), 6 layers, bf16.
  B=benchmarks/dsv4_verify.py
  for e in 6 8 6; do
    run main 100 X=1 --layers 6 --experts 8 --experts-per-token $e --context 1024 --lengths 1,2,4,8
  done
  ;;
9)
  # Where the verify's extra time goes: a layer's matmuls at M = 1..8 rows,
  # and the host's graph building against the evaluation of a forward.
  B=benchmarks/dsv4_rows_ops.py
  run main 100 X=1
  run main 150 X=1 --forward --layers 6 --experts 8
  run main 250 X=1 --forward --layers 43 --experts 8
  ;;
10)
  # 4-bit at 43 layers on a fresh machine in one process: its warm-up pays
  # the quantized matmuls' compile (CUTLASS, over 4 minutes), then main
  # beside mlx-vlm. The compiled kernels come back in $OUT/ptx.tar.xz.
  run main 520 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  [ -d /tmp/mlx ] && tar -C /tmp -cf - mlx | xz -1 > $OUT/ptx.tar.xz
  ;;
11)
  # b535387's 4-bit beside mlx-vlm (kernels compiled by part 10), then
  # part 6's warm-up and its rounds with the oracle drafters.
  run b535387 130 X=1 $L43 --bits 4 --prefill 2048 --decode 1024 --steps 24 $P
  B=benchmarks/dsv4_verify.py
  PAT='round|step|plain|MTP|DSpark|rc |Error|error|Killed'
  run main 110 X=1 --layers 5 --experts 8 --context 256 --no-verify --rounds --mtp-k 1,2,3 --dspark --peer --oracle --oracle-sets published --tokens 8 --repeat 1
  run main 300 X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 1,2,3 --dspark --oracle --oracle-sets published --tokens 32 --repeat 2
  ;;
12)
  # mlx-vlm's rounds beside ours, repeated (part 6's last line).
  B=benchmarks/dsv4_verify.py
  PAT='round|step|plain|MTP|DSpark|rc |Error|error|Killed'
  run main ${LIMIT:-300} X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 2 --dspark --dspark-blocks 2,5 --peer --tokens 24 --repeat 2
  ;;
13)
  # Where a pipelined step's time goes against a step one at a time.
  B=benchmarks/dsv4_async_steps.py
  PAT='step|stream|time|GB|rc |Error|error|Killed'
  run main ${LIMIT:-400} X=1 --layers 43 --experts 8 --context 1024 --tokens 32 --repeat 3
  ;;
14)
  # Issue 41, steps of fixed shapes (fixed/: main with the trial
  # benchmarks/trials/dsv4-whole-pool.diff): a step reads the whole pool,
  # masked, so its shapes change every 256 entries; against the pool's
  # visible entries (the flag flipped), alternated in one process, MLX's
  # CUDA graphs on, then off.
  B=benchmarks/dsv4_verify.py
  PAT='round|step|plain|MTP|DSpark|rc |Error|error|Killed'
  R="--context 1024 --no-verify --rounds --mtp-k 2 --dspark --dspark-blocks 5"
  run fixed 100 X=1 --layers 5 --experts 8 $R --flag-ab _WHOLE_POOL --tokens 8 --repeat 1
  run fixed 230 X=1 $L43 $R --flag-ab _WHOLE_POOL --tokens 24 --repeat 3
  run fixed 200 MLX_USE_CUDA_GRAPHS=0 $L43 $R --flag-ab _WHOLE_POOL --tokens 24 --repeat 3
  ;;
15)
  # Issue 41's table on the H200 (main): decode after 1K and 32K and
  # prefill of 16K beside mlx-vlm's exact indexer; the rounds with the
  # oracle drafters at the published acceptance, one row.
  run main 300 X=1 $L43 --prefill 16384 --decode 1024,32768 --steps 24 --repeat 3 $P
  B=benchmarks/dsv4_verify.py
  PAT='round|step|plain|MTP|DSpark|oracle|rc |Error|error|Killed'
  run main ${LIMIT:-260} X=1 $L43 --context 1024 --no-verify --rounds --mtp-k 2 --dspark --dspark-blocks 5 --oracle --oracle-sets published --tokens 32 --repeat 3
  ;;
16)
  # How far a float32 verify is from its steps without TF32 (the float32
  # guarantee on CUDA), both pool widths; then the 4-row batch's oracle.
  B=benchmarks/dsv4_verify.py
  PAT='verify|differ|round|step|plain|MTP|DSpark|oracle|rows|rc |Error|error|Killed'
  run fixed 200 MLX_ENABLE_TF32=0 --layers 20 --experts 8 --context 1024 --no-verify --exactness --exactness-rounds 16 --flag-ab _WHOLE_POOL
  run main ${LIMIT:-200} X=1 $L43 --context 1024 --no-verify --mtp-k 2 --dspark --dspark-blocks 5 --batch 4 --oracle --oracle-sets published --tokens 24 --repeat 3
  ;;
17)
  # The server's 4 concurrent requests at Flash's depth (bf16; each server
  # alone on the device), against the same server without drafting.
  B=benchmarks/dsv4_server_oracle.py
  PAT='server|tok/s|round|plain|MTP|DSpark|oracle|rc |Error|error|Killed'
  # Two folders of weights (about 0.7 GB a bf16 layer each) on the disk.
  free=$(df -BG --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -dc 0-9)
  layers=$(( (free - 8) * 10 / 14 )); [ $layers -gt 43 ] && layers=43
  echo "disk: ${free} GB free, $layers layers"
  run main ${LIMIT:-570} X=1 --layers $layers --experts 8 --dtype bfloat16 --repeat 1 --oracle-truth self --one-at-a-time
  ;;
18)
  # Why dsv4_speed.py's loop read the fork's 16K prefill below the peer's
  # where dsv4_prefill_chunks.py read it above: prefill alone, then with
  # decode steps between (MLX's cache of graph executables), then with 10x
  # that cache. The first process of a fresh machine compiles for 100+ s.
  run main 150 X=1 $L43 --prefill 16384 --decode "" --repeat 3 $P
  run main 200 X=1 $L43 --prefill 16384 --decode 1024 --steps 24 --repeat 3 $P
  run main 200 MLX_CUDA_GRAPH_CACHE_SIZE=4000 $L43 --prefill 16384 --decode 1024 --steps 24 --repeat 3 $P
  ;;
19)
  # The 4-bit rounds with MLX's CUDA graphs on.
  B=benchmarks/dsv4_verify.py
  PAT='round|step|plain|MTP|DSpark|rc |Error|error|Killed'
  run main 370 X=1 $L43 --bits 4 --context 1024 --no-verify --rounds --mtp-k 2 --dspark --dspark-blocks 5 --tokens 24 --repeat 3
  ;;
esac
