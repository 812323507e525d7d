#!/usr/bin/env bash
# Builds what the GPU suite carries to the GPU machine (which has no cargo registry and no
# Vulkan loader): `tally` with its CUDA, wgpu and CPU backends and the kernel tests built for
# CUDA, stripped and xz-packed into .gpu/, and the Vulkan/GL loader packages into .gl/. Both
# folders are git-ignored; name them in the device run's `carry`. Then, there:
# `benches/gpu/suite.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"
mkdir -p .gpu .gl
# The same fingerprint for the vendored cubecl-cuda as CI's clone (Burn's CUDA stack built once).
scripts/vendor-mtimes.sh
# The `tally` the README's `cargo test-all` builds (and CI tests): CUDA, wgpu and the CPU in one
# binary, so the CUDA and wgpu stages run the same build, and a session that has run the tests
# has built it (on a cold machine each other feature set compiles Burn's stack once more).
cargo test-all --no-run
strip -o .gpu/tally "$CARGO_TARGET_DIR/release/tally"
xz -T0 -6 -f .gpu/tally
# The kernel tests, built for CUDA (feature `tally-shaders/cuda` added to test-all's: each
# kernel alone, then every fixture model's forward pass), so that only tally's crates compile
# again. (Not cuda_codegen nor cuda_launches: they run on an offline runtime, here and in CI,
# and need no GPU.)
cargo test-all --features tally-shaders/cuda --no-run --message-format=json \
    --test kernels --test kernels_f16 --test models_on_gpu | benches/gpu/test_executables.py tally-shaders |
    while read -r name path; do
        strip -o ".gpu/test-$name" "$path"
        xz -T0 -6 -f ".gpu/test-$name"
    done
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
    apt_amd64="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64"
    mkdir -p /tmp/amd64/partial
    apt-get $apt_amd64 update -q
    (cd .gl && apt-get $apt_amd64 download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
# The commit the binaries were built from (`-dirty`: with uncommitted changes), which the
# suite's env stage prints: a later session can see whether .gpu/ is current.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo -dirty)" >.gpu/built-at
ls -la .gpu .gl
