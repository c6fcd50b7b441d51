#!/usr/bin/env bash
# Every number of the Performance page's causal table, in one run, on two cores at one torch thread each.
#
#   benchmarks/run_causal_table.sh [OUT]          (default OUT: results/bench/causal)
#
# First the counts, deterministic (the load does not change them), on both cores: matmul FLOPs per token of
# every pair on core 0; the operations of a causal step at 1K, 16K and 64K and of a decode step of every pair
# on core 1. Then, alone on the machine (a job on the other core slowed these timings by about 1.4x):
# causal forward+backward against causal SDPA, a fresh process per point, time at 1K, 8K and 16K and peak
# memory (one forward+backward) at 8K and 32K; then generate() of the decoding benchmark's Llama at a 4K and
# a 32K prompt. The table is printed at the end and written to OUT/table.md.
#
# Nothing else may run while it times. Each step's log is OUT/*.log.
set -euo pipefail
out=${1:-results/bench/causal}
mkdir -p "$out"
# bench MODULE ARGS...: one benchmark module at one torch thread; on_core N bench ...: pinned to core N
# (taskset runs a program, not a shell function, so the pinning wraps uv itself).
bench() { OMP_NUM_THREADS=1 ${pin:-} uv run --frozen --package spectraformer-benchmarks python -m "spectraformer_benchmarks.$1" "${@:2}"; }
on_core() { if command -v taskset >/dev/null; then pin="taskset -c $1" "${@:2}"; else "${@:2}"; fi; }
pairs=(posrf-orf oprf-fastfoodl gerf-qmc saderf-sorf posrf-hyp-orf trigrf-sorf)
start=$(date +%s)
echo "causal table: started $(date -u '+%Y-%m-%d %H:%M UTC'), results under $out"
on_core 0 bench causal --part flops --out "$out" >"$out/flops.log" 2>&1 &
(
    on_core 1 bench operation_counts --batch 1 --causal yes --lengths 1024 16384 65536 \
        --attentions "${pairs[@]}" --out "$out/operations.json" >"$out/operations.md" 2>&1
    on_core 1 bench operation_counts --decode --out "$out/decode.json" >"$out/decode.md" 2>&1
) &
wait
echo "counts done after $(($(date +%s) - start)) s"
on_core 0 bench causal --part measure --attentions softmax "${pairs[@]}" \
    --lengths 1024 8192 16384 --memory-lengths 8192 32768 --repeats 3 --repeats-at 16384=1 \
    --out "$out" >"$out/measure.log" 2>&1
echo "measure done after $(($(date +%s) - start)) s"
on_core 0 bench decoding --generate --contexts 4096 32768 --rounds 1 --tokens 8 --key-cache-max 4096 \
    >"$out/generate.md" 2>&1
echo "generate done after $(($(date +%s) - start)) s"
bench causal --table "$out" | tee "$out/table.md"
echo
tail -n 8 "$out/generate.md"
echo "causal table: finished $(date -u '+%Y-%m-%d %H:%M UTC') after $(($(date +%s) - start)) s"
