#!/usr/bin/env bash
# The GPU suite: one command on the GPU machine proves correctness and measures speed.
#
#   benches/gpu/prepare.sh             # here: builds the binaries into .gpu/, Vulkan loaders into .gl/
#   benches/gpu/suite.sh               # there (device run, carry .gpu and .gl): results into $OUT
#   benches/gpu/lease.sh 1, then 2     # there: the suite as one 15-minute lease runs it (two calls)
#   TALLY_SUITE_DRY_RUN=1 benches/gpu/suite.sh   # here, on the CPU with the tiny preset
#
# Stages (TALLY_SUITE_STAGES, run in the order given; default all, the headline numbers first): env
# canary scenario profile ncu peers attention fixtures kernels coldstart load wgpu chart. TALLY_SUITE_DTYPES, TALLY_SUITE_MATMULS (cubecl cublas cublas-sync),
# TALLY_SUITE_ATTENTIONS (flash tiled kernel cascade; the first is the one profiled and split),
# TALLY_SUITE_TILES (the tile kernels' other tile shapes the attention stage times), TALLY_SUITE_SCENARIOS (s1 s2), TALLY_SUITE_CASES and
# TALLY_SUITE_PEER_SCENARIOS narrow them, TALLY_SUITE_KERNEL_TESTS the kernel stage's test
# executables (kernels kernels_f16 models_on_gpu; each cut at TALLY_SUITE_KERNEL_SECONDS, 240; TALLY_SUITE_KERNEL_SKIP leaves tests out). TALLY_SUITE_TILE_FLAGS adds flags to every command that
# runs the tile kernels (e.g. "--fragment-loads elements" should ldmatrix fail on a machine).
# TALLY_SUITE_FLASH_VARIANTS the flash kernel's variants timed beside its default (see below);
# the canary stage checks each on a small layer first (TALLY_SUITE_CANARY_SECONDS, 60), and the
# scenario, profile, attention and wgpu stages cut each run at TALLY_SUITE_RUN_SECONDS (120);
# TALLY_SUITE_WGPU_SECONDS gives the wgpu stage a budget in all.
# TALLY_SUITE_NCU_LAUNCHES (80) and TALLY_SUITE_NCU_SECONDS (300) bound the ncu stage,
# TALLY_SUITE_NCU_VARIANT profiles one flash variant there instead of the defaults;
# TALLY_SUITE_FIXTURE_DTYPES overrides TALLY_SUITE_DTYPES for the fixtures stage;
# TALLY_SUITE_SCENARIO_EXTRAS and TALLY_SUITE_ATTENTION_EXTRAS narrow the scenario and
# attention stages' comparisons (see there); TALLY_SUITE_LOAD_EXTRAS=no-overlap adds one to the
# load stage.
# A stage that fails is recorded and the suite goes on; the exit status counts the failures.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
# The suite's binaries, model and results live under TALLY_SUITE_WORK (/tmp/tally-suite). Results
# gather in $out; after every stage they are packed into $OUT/suite-results.tgz (the device tool
# returns at most 8 files, so one archive; a stage cut off still leaves the rest).
OUT=${OUT:-$repo/target/gpu-suite}
bin=${TALLY_SUITE_WORK:-/tmp/tally-suite}
out=$bin/results
# TALLY_SUITE_KEEP=1 adds to the results of an earlier invocation on the same machine.
[ "${TALLY_SUITE_KEEP:-0}" = 1 ] || rm -rf "$out"
mkdir -p "$OUT" "$out"
all_stages="env canary scenario profile ncu peers attention fixtures kernels coldstart load wgpu chart"
stages=${TALLY_SUITE_STAGES:-$all_stages}
attentions=${TALLY_SUITE_ATTENTIONS:-flash tiled kernel cascade}
scenarios=${TALLY_SUITE_SCENARIOS:-s1 s2}
tiles=${TALLY_SUITE_TILES-64x16 128x32}  # empty: no sweep
dry=${TALLY_SUITE_DRY_RUN:-0}
# Whether the word $1 is one of the words of $2.
listed() { [[ " $2 " == *" $1 "* ]]; }
# A variant's flags, as words.
variant_flags() {
    local flags=${1#*=}
    echo "${flags//,/ }"
}
read -r -a tile_flags <<<"${TALLY_SUITE_TILE_FLAGS:-}"

if [ "$dry" = 1 ]; then
    # The CPU rehearsal: the same stages and commands, the tiny preset, the CPU backend.
    cuda=${TALLY_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/tally}; wgpu=$cuda
    gpu=cpu; gpu_dtypes="float32"; preset=tiny; items=50; requests=3; iterations=2
    load_dtype=float32; load_levels="2 4"; load_seconds=4; python=${TALLY_SUITE_PYTHON:-python3}
    matmuls=cubecl; split_tokens=512; tiles=${TALLY_SUITE_TILES:-128x32}
    # A rehearsal checks that every command runs, not the numbers (the workspace's tests check
    # those): one layer's attention at an eighth of S1's prefix and a quarter of its heads, and the
    # fixtures' cases on the two tied-embedding models (`tied_` names `untied_` too). At S1's
    # shape and every case, the rehearsal took ~16 of CI's 90 minutes on 2 cores (59 s so).
    attention_shape=(--prefix 256 --q-heads 4 --kv-heads 2); cases_default=tied_
else
    # One build with both backends (prepare.sh): CUDA's stages and wgpu's run the same binary.
    xz -dc .gpu/tally.xz >$bin/tally && chmod +x $bin/tally
    cuda=$bin/tally; wgpu=$bin/tally
    gpu=cuda; gpu_dtypes=${TALLY_SUITE_DTYPES:-float32 bfloat16}; preset=qwen3-0.6b; items=500; requests=6; iterations=10
    load_dtype=bfloat16; load_levels="100 300 1000 2000"; load_seconds=15; python=python3
    matmuls=${TALLY_SUITE_MATMULS:-cublas cubecl}; split_tokens=8192
    attention_shape=(); cases_default=
    # Compiled kernels (PTX) cached on disk: every process after the first skips NVRTC.
    printf '[compilation]\ncache = "target"\n' >cubecl.toml
    # cudarc dlopens libcuda, libnvrtc and libcublasLt by name: point the loader at wherever this
    # machine has them.
    for lib in libcuda.so libnvrtc.so.13 libcublasLt.so.13; do
        dir=$(dirname "$(find / -xdev \( -name "$lib" -o -name "$lib.*" \) -not -path '*/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
        [ -n "$dir" ] && [ "$dir" != . ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    # wgpu needs a Vulkan loader, which the machine lacks: unpack the carried one.
    if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
    export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
fi

# The flash kernel's variants the attention and scenario stages time beside its default, as
# NAME=FLAGS with the flags joined by commas: `untuned`, the static default (`--tile-tuning off`;
# since session 47 CUDA's default times the candidates below at start-up and keeps the fastest,
# the scenario's JSON and table say which), then every other candidate that tuning times, as
# `tally bench tile-candidates` names and spells them (server/src/tile_candidates.rs: the one
# list, so the suite times what the tuning picks from). On CUDA since the H200 run of 2026-11-27
# the default is 128x64 with cp.async staging, 32 rows a warp and denormals flushed; `filled`
# packs the tiles full (S1: 1,264 cubes, five waves of two a SM on an H200, against 1,336 and
# six), `split-barriers` waits on two barriers a buffer (its copies landed; its readers done)
# where the default waits on one a step for the whole cube (session 41), and `warps12` is the
# tile that keeps 12 warps an SM where the default keeps 8 (64 rows of 16 a warp, 32-key steps:
# 166 registers and 36 KB of shared memory a cube, three cubes an SM; filled, since a 32-token
# tile holds one whole 20-token item; session 42). `ahead` multiplies the next key step's scores
# during this step's softmax (three stages: FlashAttention-3's overlap within a warp, which needs
# the scores' registers twice, so 16 rows a warp: 232 registers, 106 KB of shared memory, one
# 8-warp cube an SM at 128 rows; filled, as one cube an SM leaves S1's 1,336 whole-item cubes 11
# waves where 1,264 filled ones take 10: read it against `filled`), and `ahead12` does so on
# warps12's tile (164 registers, 53 KB: three cubes, 12 warps, an SM; session 46). Timed on
# 2026-11-27 and dropped since: denormals kept (1.784 ms a layer against 1.531), 32-key steps at
# 128 rows (1.790 without flushing), the default before them (`--kv-staging registers
# --warp-rows 16 --flush-denormals false`, 1.634), and 16 rows a warp alone (`warp16`, 7,866
# items/s against 7,958). TALLY_SUITE_FLASH_VARIANTS replaces the list; empty: none.
# Read once: a line a candidate, its name then its flags.
tuning_candidates=$("$cuda" bench tile-candidates --backend cuda)
candidate_variants() {
    local name flags
    while read -r name flags; do
        [ -z "$name" ] || printf '%s=%s ' "$(variant_of "$name")" "${flags// /,}"
    done <<<"$tuning_candidates"
}
# The suite's name for a tuning candidate: the static default runs as `untuned`.
variant_of() { [ "$1" = default ] && echo untuned || echo "$1"; }
all_flash_variants=${TALLY_SUITE_FLASH_VARIANTS-$(candidate_variants)}
[ -n "${TALLY_SUITE_FLASH_VARIANTS+set}" ] || [ -n "$all_flash_variants" ] ||
    echo "suite: $cuda lists no tile candidates (bench tile-candidates failed): no flash variants to time or check" >&2
flash_variants=$all_flash_variants
all_tile_flags=("${tile_flags[@]}")

# A benchmark's process cut at $1 seconds (killed 10 s later if it ignores the signal): a kernel
# that hangs costs its run, not the call's minutes. The scenario, profile and attention stages'
# runs: TALLY_SUITE_RUN_SECONDS (120; an S1 run took ~15-40 s on the H200, its first with the
# tile tuning and the compiles).
bounded() { local seconds=$1; shift; timeout -k 10 "$seconds" "$@"; }
run_seconds=${TALLY_SUITE_RUN_SECONDS:-120}

# What a canary (this call's, or a kept earlier call's) found: the flash variants that failed it
# left out of every later stage, and every tile tuning narrowed to the candidates that passed
# (`--tile-candidates`, in the flags of every command that runs the tile kernels).
canary_failed() { listed "$1" "$(cat "$out/canary-failed" 2>/dev/null)"; }
leave_out_failed_tiles() {
    flash_variants=$all_flash_variants; tile_flags=("${all_tile_flags[@]}")
    local failed name flags variant kept="" passed=""
    failed=$(cat "$out/canary-failed" 2>/dev/null)
    [ -n "${failed// /}" ] || return 0
    for variant in $all_flash_variants; do listed "${variant%%=*}" "$failed" || kept+="$variant "; done
    flash_variants=$kept
    while read -r name flags; do
        [ -z "$name" ] || listed "$(variant_of "$name")" "$failed" || passed+="${passed:+,}$name"
    done <<<"$tuning_candidates"
    [ -z "$passed" ] || tile_flags+=(--tile-candidates "$passed")
}
leave_out_failed_tiles

failures=0
stage() { # stage NAME COMMAND...: runs one stage, logs it, records its status and time
    local name=$1; shift
    echo "=== $name"
    local start=$SECONDS
    if "$@" 2>&1 | tee -a "$out/suite.log"; then status=ok; else status=failed; failures=$((failures + 1)); fi
    echo "=== $name: $status in $((SECONDS - start)) s" | tee -a "$out/suite.log"
    echo "{\"stage\":\"$name\",\"status\":\"$status\",\"seconds\":$((SECONDS - start))}" >>"$out/stages.jsonl"
    tar czf "$OUT/suite-results.tgz" -C "$out" .
    # A stage runs in the pipeline's subshell: what a canary found reaches the stages after it here.
    leave_out_failed_tiles
}

env_stage() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>/dev/null || true
    "$cuda" --version
    echo "binaries built at $(cat .gpu/built-at 2>/dev/null || echo 'an unknown commit (not by prepare.sh)')"
}

# Every flash tile the later stages run (the static default and each variant) and the default
# tile's prefix walk in four parts (`prefix-parts`: the split kernel and its merge, which the
# attention stage's prefix-splits extra runs), first on one small layer against dense attention
# (`bench attention`: a 300-token prefix, five key steps of CUDA's tile; 37 items of 17 tokens,
# so items across tile edges and a last tile part full), in the last dtype (tensor cores on
# CUDA), each in its own process cut at TALLY_SUITE_CANARY_SECONDS (60), its dense matmuls
# autotuned at the minimal level (correctness only). A kernel changed since the last lease
# reaches the next one unrun on tensor cores (sessions 34-49's all did); one that faults, hangs
# or disagrees would otherwise take a call's minutes with it, since every start on the defaults
# times every candidate. The names that fail go to canary-failed, which this call's later stages
# and a kept call's read (`leave_out_failed_tiles`).
canary_stage() {
    local ok=0 variant name status failed=""
    for variant in $all_flash_variants prefix-parts=--prefix-splits,4; do
        name=${variant%%=*}
        CUBECL_AUTOTUNE_LEVEL=minimal bounded ${TALLY_SUITE_CANARY_SECONDS:-60} "$cuda" bench attention --backend $gpu --dtype ${gpu_dtypes##* } --prefix 300 --items 37 --item-len 17 --iterations 1 \
            "${all_tile_flags[@]}" $(variant_flags $variant) --routes flash >"$out/canary-$name.stdout" 2>&1
        status=$?
        if [ $status = 0 ]; then
            echo "canary: $name agrees with dense attention"
        else
            echo "canary: $name failed (status $status$([ $status = 124 ] && echo ', cut'); canary-$name.stdout):"
            tail -3 "$out/canary-$name.stdout"
            failed+="$name "; ok=1
        fi
    done
    echo "$failed" >"$out/canary-failed"
    leave_out_failed_tiles
    [ -z "$failed" ] || echo "canary: the later stages leave out ${failed% }; their flags: ${tile_flags[*]:-none}"
    return $ok
}

fixtures_stage() {
    local ok=0 cases
    # The tile the flags describe, untuned: a tuning would time six candidates on every fixture
    # model (each head size compiles its own kernels). Every candidate is checked elsewhere: the
    # attention stage against dense attention at S1's shape, kernels_f16 at its tiles' edges,
    # and each tuning against its first candidate's output.
    local flags="${tile_flags[*]} --tile-tuning off" variant
    # Where the canary failed the static default, the first variant that passed it: the fixtures
    # check what the tunings now pick from, not a kernel already known wrong.
    if canary_failed untuned && [ -n "$flash_variants" ]; then
        variant=${flash_variants%% *}
        flags="${tile_flags[*]} $(variant_flags $variant)"
        echo "fixtures: the canary failed the default tile; checking ${variant%%=*} in its place"
    fi
    # TALLY_SUITE_FIXTURE_DTYPES: the fixtures' own dtypes, so a run that times bf16 alone can
    # still check float32's 1e-3 (cheap beside the scenarios).
    for dtype in ${TALLY_SUITE_FIXTURE_DTYPES:-$gpu_dtypes}; do
        tol="--tolerance 1e-3"; cases=${TALLY_SUITE_CASES:-$cases_default}
        # bf16 checks only the mild cases: the sharp ones are beyond any bf16 forward (fixtures-bf16-floor.json).
        [ "$dtype" = bfloat16 ] && tol="--tolerance 3e-2" && cases=${TALLY_SUITE_CASES:-mild_bf16}
        for attention in $attentions; do
            for matmul in $matmuls; do
                # Correctness needs no tuned matmuls: minimal autotuning (seen on the H100: ~40 s a
                # case with the default level, every new shape tuned and compiled).
                CUBECL_AUTOTUNE_LEVEL=minimal python3 benches/gpu/check_fixtures.py "$cuda" --backend $gpu --dtype $dtype --attention $attention --matmul $matmul $tol \
                    --tally-flags "$flags" --cases "$cases" --out "$out/fixtures-$gpu-$dtype-$attention-$matmul.json" || ok=1
            done
        done
        # Burn's fused elementwise ops in place of tally's kernels (CUDA's default), on the first
        # attention route and matmul.
        CUBECL_AUTOTUNE_LEVEL=minimal python3 benches/gpu/check_fixtures.py "$cuda" --backend $gpu --dtype $dtype --attention ${attentions%% *} --matmul ${matmuls%% *} \
            --tally-flags "$flags" --elementwise burn $tol --cases "$cases" --out "$out/fixtures-$gpu-$dtype-${attentions%% *}-${matmuls%% *}-elementwise-burn.json" || ok=1
    done
    return $ok
}

# One layer's attention on every route; in the last dtype (bfloat16 on CUDA: tensor cores) also
# the tile kernels' other tile shapes (TALLY_SUITE_TILES, rows x keys), to pick their default, and
# at the default tile the flash kernel with one key step in flight, with its fragments read
# element by element, and each of its variants (TALLY_SUITE_FLASH_VARIANTS, beside CUDA's
# defaults: 128x64, two stages, ldmatrix, cp.async, 32 rows a warp, denormals flushed).
# TALLY_SUITE_ATTENTION_EXTRAS narrows the comparisons beside the variants (default all:
# one-stage, cascade-softmax, cascade-scores, element-loads; each ~11 s on the H200, all four
# measured on 2026-11-27, so a lease short of time can leave them out; and prefix-splits, since
# session 49: S1's query with 10 and with 100 items, too few tiles to fill the GPU's cube slots,
# the flash walk whole against `--prefix-splits auto`, which the wave count cuts in 8 and 4
# parts on an H200).
attention_extras=${TALLY_SUITE_ATTENTION_EXTRAS-one-stage cascade-softmax cascade-scores element-loads prefix-splits}
attention_stage() {
    local ok=0 last=${gpu_dtypes##* }
    for dtype in $gpu_dtypes; do
        bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $dtype --items $items "${attention_shape[@]}" --iterations $iterations "${tile_flags[@]}" --out "$out/attention-$gpu-$dtype.json" || ok=1
    done
    for tile in $tiles; do
        bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $items "${attention_shape[@]}" --iterations $iterations "${tile_flags[@]}" \
            --tile-rows ${tile%x*} --tile-keys ${tile#*x} --routes tiled,flash --out "$out/attention-$gpu-$last-tile-$tile.json" || ok=1
    done
    listed one-stage "$attention_extras" && { bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $items "${attention_shape[@]}" --iterations $iterations --tile-stages 1 --routes flash \
        --out "$out/attention-$gpu-$last-one-stage.json" || ok=1; }
    # The cascade's softmax in Burn's ops (the first run above has tally's kernel where the
    # elementwise route is the kernels', CUDA's default).
    listed cascade-softmax "$attention_extras" && { bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $items "${attention_shape[@]}" --iterations $iterations --elementwise burn --routes cascade \
        --out "$out/attention-$gpu-$last-cascade-burn-softmax.json" || ok=1; }
    # Its scores rounded to the model's dtype (half the bytes; the first run has cuBLASLt's
    # float32 accumulators as they are).
    listed cascade-scores "$attention_extras" && { bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $items "${attention_shape[@]}" --iterations $iterations --cascade-scores model --routes cascade \
        --out "$out/attention-$gpu-$last-cascade-model-scores.json" || ok=1; }
    listed element-loads "$attention_extras" && { bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $items "${attention_shape[@]}" --iterations $iterations --fragment-loads elements --routes tiled,flash \
        --out "$out/attention-$gpu-$last-element-loads.json" || ok=1; }
    if listed prefix-splits "$attention_extras" && canary_failed prefix-parts; then
        echo "attention: no prefix-splits runs (the canary failed the split walk)"; ok=1
    elif listed prefix-splits "$attention_extras"; then
        for few in 10 100; do
            for splits in whole auto; do
                bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $few "${attention_shape[@]}" --iterations $iterations "${tile_flags[@]}" --prefix-splits $splits --routes flash \
                    --out "$out/attention-$gpu-$last-items$few-prefix-$splits.json" || ok=1
            done
        done
    fi
    for variant in $flash_variants; do
        # `bench attention` never tunes: its default run is the untuned tile already.
        [ "${variant%%=*}" = untuned ] && continue
        bounded $run_seconds "$cuda" bench attention --backend $gpu --dtype $last --items $items "${attention_shape[@]}" --iterations $iterations "${tile_flags[@]}" $(variant_flags $variant) --routes flash \
            --out "$out/attention-$gpu-$last-${variant%%=*}.json" || ok=1
    done
    return $ok
}

# A matmul route as tally's flags: `cublas-sync` is cuBLASLt with two host syncs a GEMM
# (`--cublas-ordering sync`) where `cublas` enqueues on CubeCL's own stream.
matmul_flags() { case $1 in cublas-sync) echo "--matmul cublas --cublas-ordering sync" ;; *) echo "--matmul $1" ;; esac; }

model=$bin/model-$preset
make_model() { [ -f $model/config.json ] || "$cuda" make-model --preset $preset --out $model >/dev/null; }

# Every route combination (matmul × attention) on each scenario (on CUDA the pass budget comes from
# the device's free memory: S1's 10,020 item tokens are one pass), then for each matmul route S1
# split into passes of the old fixed budget (8,192 tokens: two passes), to see what one pass buys,
# and S1 with Burn's fused elementwise ops in place of tally's kernels (CUDA's default).
# TALLY_SUITE_SCENARIO_EXTRAS names which of the comparisons run (default all: split,
# elementwise-burn, fusion, cublas-sync, cublas-algos, cascade); a lease that measured them once can spend
# the time elsewhere. cublas-algos: each GEMM shape class's algorithm the fastest of cuBLASLt's
# first 8 heuristic picks, timed (the search's table goes to the log and to a .stdout beside the
# JSON). cascade: S1 on the cascade (its GEMMs on the matmul route, its softmax tally's kernel,
# its scores float32 on cuBLASLt), where TALLY_SUITE_ATTENTIONS does not run it already; its
# GEMM table (the cascade's batched score and weight GEMMs by shape) to a .stdout likewise.
# fusion: S1 and S2 through Burn's fusion layer (`--fusion on`, CUDA's only path before session
# 41), against the defaults' unfused backend (the host's time a request, 3-8 ms against 20-50 on
# the offline runtime: what it buys where the host bounds a request, S2 most likely).
scenario_extras=${TALLY_SUITE_SCENARIO_EXTRAS-split elementwise-burn fusion cublas-sync cublas-algos cascade}
scenario_stage() {
    make_model || return 1
    local ok=0 first_attention=${attentions%% *}
    for dtype in $gpu_dtypes; do
        for s in $scenarios; do
            for matmul in $matmuls; do
                for attention in $attentions; do
                    bounded $run_seconds "$cuda" bench scenario --model $model --scenario $s --items $items --requests $requests --backend $gpu --dtype $dtype \
                        --attention $attention $(matmul_flags $matmul) "${tile_flags[@]}" --out "$out/scenario-$s-$gpu-$dtype-$attention-$matmul.json" || ok=1
                done
            done
        done
        for matmul in $matmuls; do
            listed split "$scenario_extras" && { bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $gpu --dtype $dtype \
                --attention $first_attention $(matmul_flags $matmul) "${tile_flags[@]}" --max-batch-tokens $split_tokens \
                --out "$out/scenario-s1-$gpu-$dtype-$first_attention-$matmul-$split_tokens-tokens.json" || ok=1; }
            listed elementwise-burn "$scenario_extras" && { bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $gpu --dtype $dtype \
                --attention $first_attention $(matmul_flags $matmul) "${tile_flags[@]}" --elementwise burn \
                --out "$out/scenario-s1-$gpu-$dtype-$first_attention-$matmul-elementwise-burn.json" || ok=1; }
            if listed fusion "$scenario_extras" && [ "$dry" = 1 ]; then
                # The CPU has no fusion layer: the rehearsal checks the flag is refused clearly.
                if bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests 1 --backend $gpu --fusion on >"$out/fusion-refused.stdout" 2>&1; then
                    echo "--fusion on ran on the CPU"; ok=1
                fi
                grep "the CPU backend has no fusion layer" "$out/fusion-refused.stdout" || ok=1
            elif listed fusion "$scenario_extras"; then
                for s in $scenarios; do
                    bounded $run_seconds "$cuda" bench scenario --model $model --scenario $s --items $items --requests $requests --backend $gpu --dtype $dtype \
                        --attention $first_attention $(matmul_flags $matmul) "${tile_flags[@]}" --fusion on \
                        --out "$out/scenario-$s-$gpu-$dtype-$first_attention-$matmul-fused.json" || ok=1
                done
            fi
            # The flash kernel's variants (cp.async, 32 rows a warp) against its default.
            if [ "$first_attention" = flash ]; then
                for variant in $flash_variants; do
                    bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $gpu --dtype $dtype --attention flash $(matmul_flags $matmul) \
                        "${tile_flags[@]}" $(variant_flags $variant) --out "$out/scenario-s1-$gpu-$dtype-flash-$matmul-${variant%%=*}.json" || ok=1
                done
            fi
            # cuBLASLt on CubeCL's stream against the same GEMMs with host syncs around each.
            [ "$matmul" = cublas ] && listed cublas-sync "$scenario_extras" && { bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $gpu --dtype $dtype \
                --attention $first_attention $(matmul_flags cublas-sync) "${tile_flags[@]}" --out "$out/scenario-s1-$gpu-$dtype-$first_attention-cublas-sync.json" || ok=1; }
            listed cascade "$scenario_extras" && ! listed cascade "$attentions" && { bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $gpu --dtype $dtype \
                --attention cascade $(matmul_flags $matmul) --out "$out/scenario-s1-$gpu-$dtype-cascade-$matmul.json" \
                | tee "$out/scenario-s1-$gpu-$dtype-cascade-$matmul.stdout" || ok=1; }
            [ "$matmul" = cublas ] && listed cublas-algos "$scenario_extras" && { bounded $run_seconds "$cuda" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $gpu --dtype $dtype \
                --attention $first_attention --matmul cublas --cublas-algos 8 "${tile_flags[@]}" --out "$out/scenario-s1-$gpu-$dtype-$first_attention-cublas-algos8.json" \
                | tee "$out/scenario-s1-$gpu-$dtype-$first_attention-cublas-algos8.stdout" || ok=1; }
        done
    done
    return $ok
}

# One warm request of each scenario (TALLY_SUITE_PROFILE_SCENARIOS, default TALLY_SUITE_SCENARIOS) split by kernel, per matmul route: a cold and a warm request, then the
# profiled one (`--profiled-request`: its query a prefix-cache hit, as in a warm request, between
# two device syncs) whose CubeCL per-kernel table (printed and reset at each sync) and cuBLASLt
# table (reset as it starts) cover it alone; top 20 as markdown, and their sum against the
# scenario stage's unprofiled warm request of the same route (the time the GPU ran none of them).
# Should no table come out, the log's tail stays beside it.
profile_stage() {
    make_model || return 1
    local ok=0 dtype=${gpu_dtypes##* } attention=${attentions%% *}
    # S2 too: at half S1's item tokens its warm request took 0.78 of S1's time (2026-11-27).
    for scenario in ${TALLY_SUITE_PROFILE_SCENARIOS:-$scenarios}; do
        for matmul in $matmuls; do
            local name=profile-$scenario-$gpu-$dtype-$attention-$matmul
            local upper=$(echo $scenario | tr a-z A-Z)
            CUBECL_DEBUG_OPTION=profile CUBECL_DEBUG_LOG=$bin/$name.log bounded $run_seconds "$cuda" bench scenario --model $model --scenario $scenario --items $items --requests 2 --profiled-request \
                --backend $gpu --dtype $dtype --attention $attention $(matmul_flags $matmul) "${tile_flags[@]}" >"$out/$name.stdout" || ok=1
            python3 benches/gpu/profile_table.py $bin/$name.log --stdout "$out/$name.stdout" --warm-json "$out/scenario-$scenario-$gpu-$dtype-$attention-$matmul.json" --title "$upper, one warm request, $gpu $dtype, $attention attention, $matmul matmuls" --out "$out/$name.md" \
                || { ok=1; tail -c 200000 $bin/$name.log >"$out/$name.log-tail"; }
            rm -f $bin/$name.log
        done
    done
    return $ok
}

# Nsight Compute on the first kernels of one warm S1 item pass (first matmul route, first attention
# route): `bench scenario --cuda-profiler-range` brackets one more request whose query is a
# prefix-cache hit, so only its item pass runs inside the range, and ncu profiles the first
# $ncu_launches launches there (the first layers; every layer runs the same kernels) with the
# speed-of-light, occupancy, launch, warp-state and scheduler sections, plus DRAM bytes per second
# and the tensor pipes' busy share where this ncu knows those metrics. Clocks are left alone (METHOD.md). The table: ncu-*.md.
# Then the first attention launch alone with warp sampling, a report per SASS instruction:
# ncu-*-attention-sass.{csv,md}.
ncu_launches=${TALLY_SUITE_NCU_LAUNCHES:-80}
ncu_stage() {
    make_model || return 1
    local dtype=${gpu_dtypes##* } attention=${attentions%% *} matmul=${matmuls%% *}
    local name=ncu-s1-$gpu-$dtype-$attention-$matmul variant_args=()
    # TALLY_SUITE_NCU_VARIANT: one of TALLY_SUITE_FLASH_VARIANTS profiled in place of the
    # defaults (a second call can profile the first call's fastest).
    if [ -n "${TALLY_SUITE_NCU_VARIANT:-}" ]; then
        for variant in $flash_variants; do
            [ "${variant%%=*}" = "$TALLY_SUITE_NCU_VARIANT" ] && read -r -a variant_args <<<"$(variant_flags $variant)"
        done
        [ ${#variant_args[@]} -gt 0 ] || { echo "ncu: no flash variant named $TALLY_SUITE_NCU_VARIANT"; return 1; }
        name=$name-$TALLY_SUITE_NCU_VARIANT
    fi
    local scenario=("$cuda" bench scenario --model $model --scenario s1 --items $items --requests 1 --backend $gpu --dtype $dtype
        --attention $attention $(matmul_flags $matmul) "${tile_flags[@]}" "${variant_args[@]}" --cuda-profiler-range)
    if [ "$dry" = 1 ]; then
        # The rehearsal has no ncu and no CUDA: the scenario must refuse the range clearly.
        echo "ncu: not in the rehearsal (its source report's script is tested in tests/bench_tools.rs); checking that a run without CUDA refuses --cuda-profiler-range"
        if "${scenario[@]}" >"$out/$name.stdout" 2>&1; then echo "it ran without CUDA"; return 1; fi
        grep "needs --backend cuda" "$out/$name.stdout"
        return
    fi
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { echo "ncu: not found on this machine"; return 1; }
    # Metrics beyond the sections only where this ncu lists them for this GPU: an unknown name
    # would fail the whole run.
    local known metrics
    known=$("$ncu" --query-metrics 2>/dev/null)
    # The stall reasons as cycles per issued instruction (what WarpStateStats charts), one
    # metric each, so the table can name where the warps wait.
    metrics=$( { grep -oE '^sm__pipe_tensor_op_[a-z0-9]+_cycles_active' <<<"$known" | sort -u | sed 's/$/.avg.pct_of_peak_sustained_active/'
        grep -oE '^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active' <<<"$known" | sort -u | sed 's/$/.ratio/'
        grep -qE '^dram__bytes[[:space:]]' <<<"$known" && echo dram__bytes.sum.per_second; } | paste -sd, -)
    timeout ${TALLY_SUITE_NCU_SECONDS:-300} "$ncu" --profile-from-start off --clock-control none --launch-count $ncu_launches \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        ${metrics:+--metrics "$metrics"} -f -o $bin/$name \
        "${scenario[@]}" >"$out/$name.stdout" 2>&1
    local status=$?
    tail -5 "$out/$name.stdout"
    [ -f $bin/$name.ncu-rep ] || { echo "ncu wrote no report (exit $status)"; return 1; }
    "$ncu" --import $bin/$name.ncu-rep --csv --page details --print-units base >"$out/$name.csv" || return 1
    # The attention kernels' details as ncu prints them, its rules' findings included (where the
    # warps stall, and why, from WarpStateStats and SchedulerStats).
    "$ncu" --import $bin/$name.ncu-rep --page details --kernel-name regex:attention >"$out/$name-attention.txt" || true
    python3 benches/gpu/ncu_table.py "$out/$name.csv" --title "ncu: S1 item pass, first $ncu_launches launches, $gpu $dtype, $attention attention${TALLY_SUITE_NCU_VARIANT:+ ($TALLY_SUITE_NCU_VARIANT)}, $matmul matmuls" \
        --out "$out/$name.md" || return 1
    # Where the attention kernel's warps wait, instruction by instruction: ncu's warp samples
    # (SourceCounters) on the range's first attention launch, exported as the source page's
    # CSV (one row a SASS instruction: samples by stall reason, executions, bank conflicts),
    # and ncu_source.py's report of it: before, in and after the key loop, by kind of
    # instruction, the hottest instructions. A second process (its cold request again), ~40 s.
    timeout ${TALLY_SUITE_NCU_SECONDS:-300} "$ncu" --profile-from-start off --clock-control none --kernel-name regex:attention --launch-count 1 \
        --section SourceCounters --section WarpStateStats -f -o $bin/$name-source \
        "${scenario[@]}" >"$out/$name-source.stdout" 2>&1
    tail -3 "$out/$name-source.stdout"
    [ -f $bin/$name-source.ncu-rep ] || { echo "ncu (source counters) wrote no report"; return 1; }
    "$ncu" --import $bin/$name-source.ncu-rep --page source --csv --print-source sass >"$out/$name-attention-sass.csv" || return 1
    python3 benches/gpu/ncu_source.py "$out/$name-attention-sass.csv" --kernel attention \
        --title "ncu warp samples: S1's first attention launch, $gpu $dtype${TALLY_SUITE_NCU_VARIANT:+ ($TALLY_SUITE_NCU_VARIANT)}" \
        >"$out/$name-attention-sass.md" || return 1
    head -40 "$out/$name-attention-sass.md"
    return $status
}

# The kernel tests on CUDA (built by prepare.sh): each kernel alone against the plain path, then
# every fixture model's forward, unfused and through fusion. The rehearsal lists the same tests
# built for wgpu, the ones prepare.sh builds for CUDA, as the README's `cargo test-all` built (and
# ran) them: nothing is rebuilt.
kernels_stage() {
    local ok=0 name path status
    if [ "$dry" = 1 ]; then
        cargo test-all --no-run --message-format=json --test kernels --test kernels_f16 --test models_on_gpu 2>/dev/null |
            benches/gpu/test_executables.py tally-shaders
    else
        for packed in .gpu/test-*.xz; do
            name=$(basename "$packed" .xz); name=${name#test-}
            xz -dc "$packed" >"$bin/test-$name" && chmod +x "$bin/test-$name" && echo "$name $bin/test-$name"
        done
    fi >"$out/kernel-tests.txt"
    [ -s "$out/kernel-tests.txt" ] || { echo "no kernel test executables"; return 1; }
    # In TALLY_SUITE_KERNEL_TESTS's order where it names them (the first is the one a cut-off call
    # must not lose), else all.
    local names=${TALLY_SUITE_KERNEL_TESTS:-$(cut -d' ' -f1 "$out/kernel-tests.txt")}
    # TALLY_SUITE_KERNEL_SKIP: tests to leave out (names or parts of them), so that a lease's
    # minutes go to the ones after a slow one (kernels_f16's cascade ran its binary's 240 s out
    # on 2026-11-27, before the fragment and cuBLASLt tests).
    local kernel_skips=() skip
    for skip in ${TALLY_SUITE_KERNEL_SKIP:-}; do kernel_skips+=(--skip "$skip"); done
    for name in $names; do
        path=$(awk -v name="$name" '$1 == name { print $2 }' "$out/kernel-tests.txt")
        [ -n "$path" ] || { echo "no kernel test executable named $name"; ok=1; continue; }
        if [ "$dry" = 1 ]; then
            "$path" --list "${kernel_skips[@]}" || ok=1
        else
            # CubeK's matmuls (the tests' CubeCL route) autotune at the minimal level, as the
            # fixtures do: on 2026-11-27 the f16 cascade test ran 250 s on CUDA without an answer,
            # most likely autotuning each of its shapes at the full level. A binary past its time
            # is cut, and the next one runs.
            CUBECL_AUTOTUNE_LEVEL=minimal TALLY_FIXTURES=$repo/tests/fixtures timeout ${TALLY_SUITE_KERNEL_SECONDS:-240} \
                "$path" --test-threads 1 "${kernel_skips[@]}" 2>&1 | tee "$out/kernels-$name.log"
            status=${PIPESTATUS[0]}
            [ "$status" = 0 ] || { echo "$name: failed or cut at ${TALLY_SUITE_KERNEL_SECONDS:-240} s (status $status)"; ok=1; }
        fi
    done
    return $ok
}

# The same GPU through wgpu (Vulkan): S1 in float32 beside CUDA's S1 from the stages above (#25's
# goal is that number), then correctness on the fixtures and one layer's attention; then the
# fixtures and S1 again with tally's register-block matmul (`--matmul block`, the browser page's;
# 2.75x autotune on lavapipe, not yet measured on a hardware GPU). In that order, most needed
# first, within TALLY_SUITE_WGPU_SECONDS (default: no budget but each run's
# TALLY_SUITE_RUN_SECONDS), so that a lease can give the stage what it has left: each run is cut
# at the budget's rest (a cut is a failure), and the runs it leaves no 15 s for are named and
# skipped (not a failure).
wgpu_stage() {
    local ok=0 backend=wgpu block=(--matmul block)
    [ "$dry" = 1 ] && backend=cpu && block=()
    local cases=${TALLY_SUITE_CASES:-$cases_default}
    local budget=${TALLY_SUITE_WGPU_SECONDS:-} started=$SECONDS
    # within NAME COMMAND...: COMMAND cut at what the budget has left (at most a run's seconds),
    # or skipped, and said so, where that is under 15 s.
    within() {
        local name=$1 seconds=$run_seconds; shift
        if [ -n "$budget" ]; then
            local left=$((budget - (SECONDS - started)))
            # Said, not failed: the budget is the lease's choice.
            [ "$left" -ge 15 ] || { echo "wgpu: $name skipped: ${left} s of the stage's ${budget} s left (TALLY_SUITE_WGPU_SECONDS)"; return 0; }
            [ "$left" -lt "$seconds" ] && seconds=$left
        fi
        bounded "$seconds" "$@" || { echo "wgpu: $name failed or cut at ${seconds} s"; return 1; }
    }
    make_model || return 1
    within "S1" "$wgpu" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $backend --out "$out/scenario-s1-wgpu-float32.json" || ok=1
    within "fixtures" python3 benches/gpu/check_fixtures.py "$wgpu" --backend $backend --cases "$cases" --out "$out/fixtures-$backend-wgpu-build.json" || ok=1
    within "attention" "$wgpu" bench attention --backend $backend --items $items "${attention_shape[@]}" --iterations $iterations --out "$out/attention-wgpu-float32.json" || ok=1
    within "fixtures, block matmul" python3 benches/gpu/check_fixtures.py "$wgpu" --backend $backend "${block[@]}" --cases "$cases" --out "$out/fixtures-$backend-wgpu-build-block.json" || ok=1
    within "S1, block matmul" "$wgpu" bench scenario --model $model --scenario s1 --items $items --requests $requests --backend $backend "${block[@]}" --out "$out/scenario-s1-wgpu-float32-block.json" || ok=1
    return $ok
}

# HF transformers on the same device and model: three ways to score, each checked against the
# float64 fixtures before it is timed.
peers_stage() {
    make_model || return 1
    local ok=0
    for s in ${TALLY_SUITE_PEER_SCENARIOS:-s1 s2}; do
        # Each peer timed for ~3 s after its warm-up (4 requests at most): the padded peer's
        # 5.5 s a request took 28 of the stage's 55 s on 2026-11-27 for a number ~26x off the best.
        PYTHONUNBUFFERED=1 $python benches/pytorch_peers.py --model $model --device $gpu --dtype ${gpu_dtypes##* } --scenario $s --items $items --seconds 3 --out "$out/peers-$s-$gpu.json" || ok=1
    done
    return $ok
}

# SGLang PR 9748's load shape: 300-token queries, 10 items of 20 tokens, Poisson arrivals, at
# rising rates; the items/s that keep P99 under 500 ms is the number. TALLY_SUITE_LOAD_EXTRAS:
# `no-overlap` runs the top rate again on a server that reads each pass before it issues the next
# (`--no-overlap`; the default issues the next batch behind the last), ~30 s more.
load_stage() {
    make_model || return 1
    local ok=0 top=${load_levels##* }
    # Connections up to 4,096 (512 by default): at 2,000 qps and ~1 s a request the server, not
    # its connection cap, sets the rate; a connection is a file descriptor on both sides.
    [ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge 8192 ] || ulimit -n 8192 2>/dev/null || echo "load: cannot raise the open-file limit to 8192 (it stays $(ulimit -n))"
    load_at "$load_levels" || ok=1
    if listed no-overlap "${TALLY_SUITE_LOAD_EXTRAS-}"; then
        load_at "$top" --no-overlap || ok=1
    fi
    return $ok
}

# One server (flags after the first word, RATES) under `bench load` at each rate, its results
# named load-qpsN.json, or with flags load-qpsN-FLAGS.json (`--no-overlap`: load-qpsN-no-overlap),
# the flags recorded in them as the server's label.
load_at() {
    local rates=$1 port=18123 ok=0 label=() suffix=""
    shift
    if [ $# -gt 0 ]; then
        label=("--server-label=$*")
        suffix=$(echo "$*" | tr -s ' ' '-' | sed 's/--*/-/g')
    fi
    local started=$(date +%s.%N)
    "$cuda" serve --model $model --backend $gpu --dtype $load_dtype $(matmul_flags ${matmuls%% *}) "${tile_flags[@]}" --port $port --max-queue 100000 --max-connections 4096 "$@" >"$out/serve$suffix.log" 2>&1 &
    local server=$!
    # The server listens once its warm-up (every pass shape compiled and tuned) is done: 4 s on
    # 2026-11-27's caches, 15 s cold on 2026-11-26; a server that exits or hangs costs 2 minutes.
    if ! wait_for_health $port $server 120; then
        echo "load: the server did not come up (serve$suffix.log)"; tail -3 "$out/serve$suffix.log"
        kill -KILL $server 2>/dev/null; wait $server
        return 1
    fi
    local ready
    ready=$(seconds_since $started)
    grep -h "warmed up in" "$out/serve$suffix.log"
    # A start on the caches the earlier runs left (kernels, autotuning, the flash tile kept), as a
    # deployment's restart on its cache volume: #25's cached start, timed at no cost. On a machine
    # started afresh for this call there are none (CubeCL's lie in the checkout's target/).
    local caches=empty
    [ -z "$(ls -A "$repo/target" 2>/dev/null | grep -v '^gpu-suite$')" ] || caches=kept
    start_json coldstart-load-server$suffix "defaults${*:+ $*}" $caches $ready "$out/serve$suffix.log"
    local before=$bin/load-warmed$suffix.metrics
    curl -sf localhost:$port/metrics >"$before"
    for qps in $rates; do
        "$cuda" bench load --url http://127.0.0.1:$port --qps $qps --duration $load_seconds --prompt-tokens 300 --items-per-request 10 --item-tokens 20 "${label[@]}" --out "$out/load-qps$qps$suffix.json" || ok=1
        # The server's counters after each rate (cumulative): requests a batch, prefill passes
        # (one pass a batch should leave it flat), items a pass, the prefix cache, and the model
        # thread's time issuing a pass against its wait for the scores.
        curl -sf localhost:$port/metrics >"$out/load-qps$qps$suffix.metrics" || echo "load: no /metrics after $qps qps"
        pass_times "$before" "$out/load-qps$qps$suffix.metrics" "$qps qps$suffix"
        before=$out/load-qps$qps$suffix.metrics
    done
    kill -TERM $server; wait $server || ok=1
    return $ok
}

# The passes between two /metrics scrapes (BEFORE AFTER LABEL): how many, the model thread's
# mean time issuing one against its mean wait for a pass's scores (device-bound if waiting is
# the larger; a wait near zero with batches issued ahead: the host keeps the device fed just in
# time, or not), and how many batches were issued behind the last, still on the device.
pass_times() {
    python3 - "$@" <<'PY'
import sys
def counters(path):
    values = {}
    try:
        lines = open(path).readlines()
    except OSError:
        return values
    for line in lines:
        name, _, value = line.strip().rpartition(" ")
        if name.startswith(("tally_pass_", "tally_batch_requests_count", "tally_batches_issued_ahead_total")) and name.endswith(("_sum", "_count", "_total")):
            values[name] = float(value)
    return values
before, after = counters(sys.argv[1]), counters(sys.argv[2])
delta = lambda name: after.get(name, 0.0) - before.get(name, 0.0)
passes = delta("tally_pass_issue_seconds_count")
if passes:
    issue, wait = (1e3 * delta(f"tally_pass_{kind}_seconds_sum") / passes for kind in ("issue", "wait"))
    batches, ahead = delta("tally_batch_requests_count"), delta("tally_batches_issued_ahead_total")
    print(f"load {sys.argv[3]}: {passes:.0f} passes, {issue:.1f} ms issuing and {wait:.1f} ms waiting a pass (means); {ahead:.0f} of {batches:.0f} batches issued ahead")
else:
    print(f"load {sys.argv[3]}: no passes counted")
PY
}

# Whether the server SERVER on PORT answers /health within SECONDS (wait_for_health PORT SERVER
# SECONDS; no longer than the server lives).
wait_for_health() {
    local port=$1 server=$2
    for _ in $(seq $(($3 * 4))); do
        curl -sf localhost:$port/health >/dev/null && return 0
        kill -0 $server 2>/dev/null || break
        sleep 0.25
    done
    curl -sf localhost:$port/health >/dev/null
}
# Seconds since START (a `date +%s.%N`), to a tenth.
seconds_since() { awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $1 }"; }

# A server start's result (NAME ROUTES CACHES SECONDS LOG): seconds to /health, and of them the
# warm-up its log reports; the summary holds them to #25's goals (60 s cold, 10 s cached).
start_json() {
    local warm_up
    warm_up=$(grep -ho 'warmed up in [0-9.]* s' "$5" | grep -o '[0-9.]*' | head -1)
    echo "{\"benchmark\":\"coldstart\",\"routes\":\"$2\",\"caches\":\"$3\",\"seconds_to_ready\":$4,\"warm_up_seconds\":${warm_up:-null},\"backend\":\"$gpu\",\"dtype\":\"$load_dtype\",\"matmul\":\"${matmuls%% *}\",\"model\":\"$(basename $model)\"}" >"$out/$1.json"
}

# How long `tally serve` takes to answer /health (load + warm-up): with empty CubeCL caches (kernel
# compilation and matmul autotuning from scratch), then restarted on the caches that run left, as
# a deployment that keeps them on a volume would be. Run from a folder with no Cargo.toml above
# it, CubeCL keeps both caches under $XDG_CACHE_HOME/cubecl.
coldstart_stage() {
    make_model || return 1
    local ok=0 port=18124 matmul=${matmuls%% *} routes=defaults flags="${tile_flags[*]}"
    # The defaults (on CUDA: flash attention, tally's elementwise kernels, cuBLASLt where it
    # loads; on the H200, 2026-11-26, 15.0 s cold and 10.6 s cached, against 31.0 and 17.3 s on
    # the earlier defaults, the row kernel and Burn's elementwise ops).
    local home=$bin/coldstart-cache-$routes run=$bin/coldstart-cwd-$routes
    rm -rf $home $run && mkdir -p $home $run
    printf '[compilation]\ncache = "target"\n' >$run/cubecl.toml
    for caches in empty filled; do
        local start server ready name=coldstart-$routes-$caches
        start=$(date +%s.%N)
        (cd $run && XDG_CACHE_HOME=$home exec "$cuda" serve --model $model --backend $gpu --dtype $load_dtype $(matmul_flags $matmul) $flags --port $port) \
            >"$out/$name.log" 2>&1 &
        server=$!
        if wait_for_health $port $server 1200; then
            ready=$(seconds_since $start)
            echo "coldstart, $routes, $caches caches: ready in $ready s ($(grep -ho 'warmed up in [0-9.]* s' "$out/$name.log"))"
            start_json $name $routes $caches $ready "$out/$name.log"
        else
            echo "coldstart, $routes: the server did not come up ($name.log)"; ok=1
        fi
        kill -TERM $server 2>/dev/null; wait $server
    done
    return $ok
}

# Everything above in one PNG, also beside the archive in $OUT, then as one table: the last output.
chart_stage() {
    "$cuda" bench chart --results "$out" --out "$out/chart.png" && cp "$out/chart.png" "$OUT/chart.png"
}

# In the order TALLY_SUITE_STAGES names them: a lease that ends early keeps what came first.
for name in $stages; do
    case " $all_stages " in *" $name "*) stage $name ${name}_stage ;; *) echo "unknown stage: $name (stages: $all_stages)"; failures=$((failures + 1)) ;; esac
done
# Every stage's outcome on one line, under the summary table.
echo "stages: $(sed -E 's/.*"stage":"([^"]*)","status":"([^"]*)","seconds":([0-9]+).*/\1 \2 \3 s/' "$out/stages.jsonl" 2>/dev/null | paste -sd, - | sed 's/,/, /g')"
echo "suite: $failures stage(s) failed; results in $OUT/suite-results.tgz"
exit $failures
