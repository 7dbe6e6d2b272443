# Sourced by scripts/ablate.sh and scripts/gemm_ab.sh: variants that are a whole source tree.
#   rev:REV   the tracked tree at git revision REV (git archive);
#   tree:DIR  the source tree in directory DIR of the repository root (one path component), e.g.
#             made with `mkdir DIR && git archive REV | tar -x -C DIR` before a device call: the
#             device machine's copy of the repository lacks commits made since its .git was
#             copied, so rev:REV of a new commit fails there, while an untracked DIR travels with
#             the working tree.
# Both functions run in the repository root and print a message naming the variant on failure.

# is_tree_variant V: V is rev:... or tree:...
is_tree_variant() { [[ $1 == rev:* || $1 == tree:* ]]; }

# check_tree_variant TOOL V: 0 when V names a commit / a qforge source tree, else 1 (message).
check_tree_variant() {
  local tool=$1 v=$2 d
  if [[ $v == rev:* ]]; then
    git rev-parse -q --verify "${v#rev:}^{commit}" >/dev/null ||
      { echo "$tool: variant $v: '${v#rev:}' is not a commit of this repository"; return 1; }
  else
    d=${v#tree:}
    [[ -n $d && $d != */* && $d != . && $d != .. ]] ||
      { echo "$tool: variant $v: expected tree:DIR, DIR one directory of the repository root"; return 1; }
    [[ -f $d/CMakeLists.txt && -f $d/templates/qforge/cast.cuh ]] ||
      { echo "$tool: variant $v: ./$d holds no qforge source tree (CMakeLists.txt, templates/qforge/cast.cuh)"; return 1; }
  fi
}

# copy_tree_variant TOOL V DEST: writes V's source tree into the (empty) directory DEST.
copy_tree_variant() {
  local tool=$1 v=$2 dest=$3
  if [[ $v == rev:* ]]; then
    git archive "${v#rev:}" | tar -C "$dest" -xf - || { echo "$tool: git archive ${v#rev:} failed"; return 1; }
  else
    (cd "${v#tree:}" && tar --exclude='./build*' -cf - .) | tar -C "$dest" -xf - ||
      { echo "$tool: copying ${v#tree:} failed"; return 1; }
  fi
}
