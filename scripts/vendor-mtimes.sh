#!/usr/bin/env bash
# Gives every file under vendor/ the time of the last commit that touched vendor/.
#
# Cargo fingerprints a path dependency that has a build script by its newest file's mtime, and
# compares that for equality: a fresh clone's files are as new as the clone, so the vendored
# cubecl-cuda, and Burn's whole CUDA stack above it, compiled again for every clone (~5 minutes
# of CI's 90 on 2 cores) though a build of the same sources sat in the shared target dir. With
# the commit's time, every clone of the same vendor/ fingerprints alike; a commit that changes
# vendor/ changes the time, and the stack compiles again, as it must.
set -euo pipefail
cd "$(dirname "$0")/.."
# Outside a git clone (an unpacked tarball) the files keep their times: a slower build, not a
# wrong one.
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "vendor-mtimes: not a git clone, vendor/ keeps its files' times" >&2
    exit 0
fi
# With vendor/ edited and not committed, the commit's time would hide the edit from Cargo (the
# fingerprint compares times, not contents) and a build would reuse the last one: leave the
# times, and the edit's own newer time rebuilds it.
if ! git diff --quiet HEAD -- vendor; then
    echo "vendor-mtimes: vendor/ has uncommitted changes, its files keep their times" >&2
    exit 0
fi
git ls-files -z vendor | xargs -0 touch -d "@$(git log -1 --format=%ct -- vendor)"
