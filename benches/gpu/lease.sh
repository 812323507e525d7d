#!/usr/bin/env bash
# The GPU suite as one 15-minute lease runs it (NOTES.md "Running the suite inside one lease"):
# two calls on one warm machine, each a device run carrying .gpu and .gl (prepare.sh first), the
# second within the 30 s the machine stays warm.
#
#   benches/gpu/lease.sh 1   # env canary scenario attention peers profile fixtures chart, cut at 480 s
#   benches/gpu/lease.sh 2   # ncu load wgpu kernels chart, adding to call 1's results, cut at 390 s
#                            # (wgpu within 90 s); kernels first where call 1's canary failed a tile
#
# The suite's variables set before it win over these (e.g. TALLY_SUITE_STAGES for a rerun of one
# stage); TALLY_LEASE_SECONDS sets the cut, which must stay under the device run's timeout_s.
# TALLY_SUITE_DRY_RUN=1 rehearses a call on the CPU (the suite's own dtypes and routes there).
set -uo pipefail
cd "$(dirname "$0")/../.."

# What the 2026-11-27 lease and the sessions since settled (NOTES.md): bf16 timed, both dtypes'
# fixtures; cuBLASLt and flash attention only; no tile sweep; of the extras only what is
# unmeasured (fusion, the prefix splits); the kernel tests, kernels_f16 first, without the
# cascade test that ran its binary's 240 s out.
export TALLY_SUITE_DTYPES=${TALLY_SUITE_DTYPES-bfloat16}
export TALLY_SUITE_MATMULS=${TALLY_SUITE_MATMULS-cublas}
export TALLY_SUITE_SCENARIOS=${TALLY_SUITE_SCENARIOS-s1 s2}
export TALLY_SUITE_PEER_SCENARIOS=${TALLY_SUITE_PEER_SCENARIOS-s1}
export TALLY_SUITE_ATTENTIONS=${TALLY_SUITE_ATTENTIONS-flash}
export TALLY_SUITE_TILES=${TALLY_SUITE_TILES-}
export TALLY_SUITE_SCENARIO_EXTRAS=${TALLY_SUITE_SCENARIO_EXTRAS-fusion}
export TALLY_SUITE_ATTENTION_EXTRAS=${TALLY_SUITE_ATTENTION_EXTRAS-prefix-splits}
export TALLY_SUITE_KERNEL_TESTS=${TALLY_SUITE_KERNEL_TESTS-kernels_f16 kernels models_on_gpu}
export TALLY_SUITE_KERNEL_SKIP=${TALLY_SUITE_KERNEL_SKIP-the_cascade_in_f16}
# Float32's fixtures too (bf16 alone is timed); the CPU rehearsal computes in float32 only.
[ "${TALLY_SUITE_DRY_RUN:-0}" = 1 ] || export TALLY_SUITE_FIXTURE_DTYPES=${TALLY_SUITE_FIXTURE_DTYPES-float32 bfloat16}

case ${1:-} in
    1)
        export TALLY_SUITE_STAGES=${TALLY_SUITE_STAGES-env canary scenario attention peers profile fixtures chart}
        exec timeout -k 10 "${TALLY_LEASE_SECONDS:-480}" benches/gpu/suite.sh
        ;;
    2)
        # A server or benchmark call 1 left behind (a run cut at its limit) would hold the GPU
        # and the load stage's port. `-x`: the process name, not a command line (`-f` would
        # match this script's own).
        pkill -x tally && sleep 1
        # wgpu on the same GPU (#25), never yet measured on a lease: S1 first, within 90 s, before
        # the kernel tests, which the canary and the fixtures stand in for where every tile passed.
        stages="ncu load wgpu kernels chart"
        # Where call 1's canary failed a tile, the kernel tests say which shape and which step
        # go wrong: they come first.
        [ -n "$(tr -d ' \n' <"${TALLY_SUITE_WORK:-/tmp/tally-suite}/results/canary-failed" 2>/dev/null)" ] && stages="kernels ncu load wgpu chart"
        export TALLY_SUITE_KEEP=1 TALLY_SUITE_LOAD_EXTRAS=${TALLY_SUITE_LOAD_EXTRAS-no-overlap} TALLY_SUITE_WGPU_SECONDS=${TALLY_SUITE_WGPU_SECONDS-90}
        export TALLY_SUITE_STAGES=${TALLY_SUITE_STAGES-$stages}
        exec timeout -k 10 "${TALLY_LEASE_SECONDS:-390}" benches/gpu/suite.sh
        ;;
    *)
        echo "usage: benches/gpu/lease.sh 1|2 (the lease's first call, then its second)" >&2
        exit 2
        ;;
esac
