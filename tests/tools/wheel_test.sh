#!/usr/bin/env bash
# wheel_test.sh SOURCE_DIR WORK_DIR PYTHON [WHEEL_BUILD_DIR]
#   PYTHON: builds the wheel (needs scikit-build-core and nanobind: scripts/setup.sh installs them)
#   and makes the venv; WHEEL_BUILD_DIR: scikit-build-core's build directory, kept between runs
#   so that a rerun rebuilds only what changed (default WORK_DIR/../wheel-build).
# The pip wheel (python/pyproject.toml, scikit-build-core) as a user gets it:
#   - `pip wheel ./python` builds it; it holds the package, libqforge.so, qforge._C, the CLI and
#     every shipped recipe under qforge/, nothing else, and depends on nvidia-cuda-nvrtc;
#   - a fresh venv installs it (nvidia-cuda-nvrtc from PyPI: needs the network);
#   - with no CUDA toolkit on PATH or LD_LIBRARY_PATH (and, where this runs as root and may make a
#     mount namespace, with /usr/local/cuda* hidden by empty mounts), the installed package
#     finds every shipped recipe's sm_90a kernels in the wheel's prewarmed kernels (qforge/kernels,
#     a shipped cache root: no compile, nothing written to the empty kernel cache, though the
#     venv's NVRTC may be a newer minor version than the build's); with those turned off
#     (QFORGE_CACHE_SHIPPED_DIRS=), it compiles one quantizer per shipped recipe for sm_90a into
#     the empty cache, through both libqforge.so and qforge._C, with each compile logged by the
#     "qforge" logger; NVRTC and its builtins must come from the venv. The installed `qforge`
#     command checks the recipes.
# Prints a summary table. ~40 s on 2 cores once the wheel is built (its first build: minutes).
set -u
src=$1 work=$2 python=$3
build=${4:-$work/../wheel-build}
fail() { echo "FAIL: $*"; exit 1; }
unset QFORGE_LIBRARY QFORGE_EXTENSION QFORGE_LOG_LEVEL LD_LIBRARY_PATH PYTHONPATH
"$python" -c "import scikit_build_core, nanobind" 2>/dev/null ||
  fail "the wheel's build needs scikit-build-core and nanobind in $python (scripts/setup.sh; pip install scikit-build-core nanobind)"
rm -rf "$work" && mkdir -p "$work" "$build" || exit 1
work=$(cd "$work" && pwd -P) build=$(cd "$build" && pwd -P) || exit 1

# 1. The wheel, built against this checkout's toolkit (the build needs it; the wheel does not).
export PATH="/usr/local/cuda/bin:$PATH"
start=$(date +%s)
"$python" -m pip wheel "$src/python" --no-deps --no-build-isolation -w "$work/dist" -C build-dir="$build" \
  >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; fail "pip wheel ./python"; }
wheel=$(ls "$work"/dist/*.whl) || fail "no wheel in $work/dist"
echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB, built in $(($(date +%s) - start)) s"

# 2. Its contents: the package and its dist-info alone; the libraries, CLI and recipes in qforge/.
"$python" - "$wheel" "$src" <<'PY' || fail "wheel contents"
import sys, zipfile
from pathlib import Path
wheel, src = sys.argv[1], Path(sys.argv[2])
z = zipfile.ZipFile(wheel)
names = z.namelist()
tops = {n.split("/")[0] for n in names}
dist = [t for t in tops if t.endswith(".dist-info")]
assert tops == {"qforge", *dist} and len(dist) == 1, f"unexpected top-level entries: {sorted(tops)}"
for need in ("qforge/__init__.py", "qforge/_capi.py", "qforge/_log.py", "qforge/torch/__init__.py",
             "qforge/libqforge.so.0.6", "qforge/bin/qforge"):
    assert need in names, f"the wheel lacks {need}"
assert [n for n in names if n.startswith("qforge/_C.") and n.endswith(".so")], "the wheel lacks qforge._C"
images = [n for n in names if n.startswith("qforge/kernels/qforge-v1/") and n.endswith("/image.bin")]
assert len(images) >= 100, f"the wheel's prewarmed kernels: {len(images)} images"
shipped = sorted(p.name for p in (src / "recipes").glob("*.json"))
packed = sorted(n.split("/")[-1] for n in names if n.startswith("qforge/recipes/"))
assert packed == shipped, f"recipes: {packed} != {shipped}"
assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], "bytecode in the wheel"
meta = z.read(f"{dist[0]}/METADATA").decode()
assert "Requires-Dist: nvidia-cuda-nvrtc" in meta, "no nvidia-cuda-nvrtc dependency"
big = sorted(((z.getinfo(n).file_size, n) for n in names), reverse=True)[:4]
print("largest files: " + ", ".join(f"{n} {s // 1024} KiB" for s, n in big))
PY

# 3. A fresh venv with the wheel and its NVRTC from PyPI.
"$python" -m venv "$work/venv" || fail "python -m venv"
"$work/venv/bin/python" -m pip install -q "$wheel" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "pip install the wheel (nvidia-cuda-nvrtc comes from PyPI: network needed)"; }
"$work/venv/bin/python" -m pip list 2>/dev/null | grep -i -E "^(qforge|nvidia)" | sed 's/^/installed: /'

# 4. No toolkit: PATH without CUDA directories, no LD_LIBRARY_PATH, an empty kernel cache; where
# possible, /usr/local/cuda* hidden (the system's loader cache may still name the toolkit's NVRTC;
# the check below fails if anything NVRTC loads comes from outside the venv).
clean_path=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd: -)
hide=""
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
  mkdir -p "$work/empty"
  for d in /usr/local/cuda*; do
    [ -d "$d" ] && [ ! -L "$d" ] && hide="$hide mount --bind '$work/empty' '$d' &&"
  done
fi
in_ns() {  # the command, in a mount namespace with the toolkit hidden where that can be done
  if [ -n "$hide" ]; then
    unshare -m sh -c "$hide exec \"\$@\"" sh "$@"
  else
    "$@"
  fi
}
if [ -n "$hide" ]; then
  echo "toolkit: not on PATH or LD_LIBRARY_PATH, /usr/local/cuda* hidden by empty mounts"
else
  echo "toolkit: not on PATH or LD_LIBRARY_PATH (no mount namespace here: /usr/local/cuda* stays visible)"
fi

cd "$work" || exit 1
in_ns env -i HOME="$work" PATH="$work/venv/bin:$clean_path" QFORGE_CACHE_DIR="$work/cache" \
  "$work/venv/bin/qforge" --version >"$work/cli.log" 2>&1 || { cat "$work/cli.log"; fail "installed qforge --version"; }
sed 's/^/cli: /' "$work/cli.log"
recipes=$(ls "$work"/venv/lib/python*/site-packages/qforge/recipes/*.json | grep -v recipe.schema.json)
# shellcheck disable=SC2086
in_ns env -i HOME="$work" PATH="$work/venv/bin:$clean_path" QFORGE_CACHE_DIR="$work/cache" \
  "$work/venv/bin/qforge" check --quiet $recipes >"$work/check.log" 2>&1 ||
  { cat "$work/check.log"; fail "installed qforge check"; }

# One check, run twice: "shipped" - the wheel's prewarmed kernels serve every shipped recipe's plans
# (nothing compiled, nothing written to the cache); "compile" - with the shipped root turned off,
# one quantizer per recipe (and one of qforge._C) compiles with the venv's NVRTC, each compile
# logged.
cat >"$work/kernels.py" <<'PY'
import logging, sys, time
from pathlib import Path
venv, mode = Path(sys.argv[1]).resolve(), sys.argv[2]
import qforge
from qforge import _ext

records = []
class Collect(logging.Handler):
    def emit(self, r):
        records.append(r.getMessage())
logging.getLogger("qforge").addHandler(Collect())
qforge.set_log_level("debug")

pkg = Path(qforge.__file__).resolve().parent
assert venv in pkg.parents, f"qforge imported from {pkg}"
lib = Path(qforge.library()._name)
assert lib.parent == pkg, f"libqforge from {lib}"
C = _ext.load()
assert Path(C.__file__).parent == pkg, f"qforge._C from {C.__file__}"

def compiled(since):
    return [m for m in records[since:] if m.startswith("compiled ")]

rows = []  # recipe, role, kernels compiled, ms: every role ("shipped"), the first linear one ("compile")
for path in sorted(p for p in qforge.recipes_dir().glob("*.json") if p.name != "recipe.schema.json"):
    ctx = qforge.Context(path)
    for role in ("linear:input", "linear:weight", "linear:grad_output"):
        try:
            q = ctx.quantizer(role)
        except qforge.UserError:
            continue
        before, t0 = len(records), time.perf_counter()
        q.prepare("sm_90a")
        ms = (time.perf_counter() - t0) * 1e3
        rows.append((path.stem, role, sum(m.count("_kernel<") for m in compiled(before)), ms))
        if mode == "compile":
            break
    else:
        if mode == "compile":
            raise AssertionError(f"{path.name}: no linear role")
# The compiled core: its own runtime copy and log sink.
before = len(records)
C.Context([str(qforge.recipes_dir() / "hybrid_mxfp8_fwd_nvfp4_bwd.json")]).quantizer("linear:grad_output").prepare("sm_90a")
core_logged = compiled(before)

if mode == "shipped":
    hits = [m for m in records if "shipped kernel" in m or "disk cache" in m]
    assert not compiled(0), f"compiled although the wheel ships the kernel: {compiled(0)[:2]}"
    assert hits, "no hit of the wheel's prewarmed kernels was logged"
    print(f"prewarmed kernels: {len(rows) + 1} shipped plans served without a compile ({len(hits)} hits logged; "
          f"{hits[0].split(':')[0]})")
    sys.exit(0)

nvrtc = sorted({line.split()[-1] for line in open("/proc/self/maps") if "nvrtc" in line})
outside = [p for p in nvrtc if venv not in Path(p).resolve().parents]
assert nvrtc and not outside, f"NVRTC loaded from outside the venv: {outside or 'nothing loaded'}"
assert all(k > 0 for _, _, k, _ in rows), "a compile was not logged"
assert core_logged, "qforge._C's compile was not logged"

print(f"{'recipe':28} {'role':20} {'kernels':>7} {'ms':>7}")
for recipe, role, kernels, ms in rows:
    print(f"{recipe:28} {role:20} {kernels:7d} {ms:7.0f}")
print(f"qforge._C: hybrid_mxfp8_fwd_nvfp4_bwd linear:grad_output, {sum(m.count('_kernel<') for m in core_logged)} kernels")
print(f"{len(rows)} recipes compiled for sm_90a, {len(records)} log records; NVRTC from the venv: "
      + ", ".join(Path(p).name for p in nvrtc))
print(f"qforge {qforge.__version__} (library {qforge.library_version()}) from {pkg}")
PY
in_ns env -i HOME="$work" PATH="$work/venv/bin:$clean_path" QFORGE_CACHE_DIR="$work/cache" \
  "$work/venv/bin/python" "$work/kernels.py" "$work/venv" shipped || fail "the wheel's prewarmed kernels"
[ -z "$(find "$work/cache" -name image.bin 2>/dev/null)" ] || fail "a shipped plan's kernel was compiled into the cache"
in_ns env -i HOME="$work" PATH="$work/venv/bin:$clean_path" QFORGE_CACHE_DIR="$work/cache" QFORGE_CACHE_SHIPPED_DIRS= \
  "$work/venv/bin/python" "$work/kernels.py" "$work/venv" compile || fail "compiling the shipped recipes from the installed wheel"
entries=$(find "$work/cache" -name image.bin | wc -l)
[ "$entries" -gt 0 ] || fail "nothing went into the kernel cache"
echo "kernel cache: $entries entries"
echo "wheel test: ok"
