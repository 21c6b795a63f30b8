#!/usr/bin/env bash
# Copy this worktree's code into /work/main/.gpuwork (git-ignored there), which `run` carries.
set -e
src=$(cd "$(dirname "$0")/.." && pwd)
dst=/work/main/.gpuwork
mkdir -p "$dst"
rm -rf "$dst/kvserve" "$dst/tests" "$dst/scripts"
cp -r "$src/kvserve" "$src/tests" "$src/scripts" "$src/pyproject.toml" "$dst/"
find "$dst" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$dst"
