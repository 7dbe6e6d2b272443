#!/usr/bin/env bash
# Copies this worktree's source (tracked + untracked, not ignored) into DEST, e.g. to run a
# device check of this tree from another checkout.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd); dest=$1
rm -rf "$dest"; mkdir -p "$dest"
cd "$src" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$dest"
