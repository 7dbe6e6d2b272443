"""ctypes declarations of libqforge.so's C API (runtime/qforge.h): structs and signatures.

Every struct mirrors its C definition field for field; tests/python compiles the header with a C
compiler and compares every field's offset and size, and each struct's size, with these.
"""
import ctypes
import importlib.util
import os
import shutil
from ctypes import POINTER, Structure, c_char_p, c_int, c_int64, c_uint64, c_void_p
from pathlib import Path

# The wheel's prewarmed kernels (qforge/kernels: the shipped recipes' sm_90a kernels, built with the
# wheel) are a shipped cache root for every library this process loads (libqforge, qforge._C) and
# for the CLI it starts (qforge._cli), unless QFORGE_CACHE_SHIPPED_DIRS is set (empty: none). The
# first call of a shipped plan then loads its kernel instead of compiling it (docs/jit.md).
SHIPPED_KERNELS = Path(__file__).resolve().parent / "kernels"
if SHIPPED_KERNELS.is_dir() and "QFORGE_CACHE_SHIPPED_DIRS" not in os.environ:
    os.environ["QFORGE_CACHE_SHIPPED_DIRS"] = str(SHIPPED_KERNELS)

QF_OK, QF_ERR_USER, QF_ERR_INTERNAL, QF_ERR_CUDA = 0, 2, 3, 4
DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}
USAGES = {None: -1, "training": 0, "inference": 1, "memory": 2}
BUFFER_KINDS = {0: "data", 1: "scale_inv", 2: "amax", 3: "scale"}


class BufferInfoC(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_char_p), ("kind", c_int), ("element_size", c_int),
                ("stream", c_int), ("zero_padding", c_int), ("ndim", c_int), ("shape", c_int64 * 4),
                ("bytes", c_int64), ("scale_layout", c_char_p)]


class NamedBufferC(Structure):
    _fields_ = [("name", c_char_p), ("ptr", c_void_p), ("bytes", c_int64)]


class QuantizeArgsC(Structure):
    _fields_ = [("input", c_void_p), ("m", c_int64), ("k", c_int64), ("buffers", POINTER(NamedBufferC)),
                ("num_buffers", c_int), ("workspace", c_void_p), ("workspace_bytes", c_int64),
                ("noop", c_void_p), ("seed", c_uint64), ("offset", c_uint64), ("member_rows", c_void_p),
                ("num_members", c_int)]


class HistoryArgsC(Structure):
    _fields_ = [("history", c_void_p), ("history_bytes", c_int64), ("amax", c_void_p), ("amax_bytes", c_int64),
                ("scale", c_void_p), ("scale_bytes", c_int64), ("scale_inv", c_void_p), ("scale_inv_bytes", c_int64),
                ("noop", c_void_p)]


class GemmSpecC(Structure):
    _fields_ = [("scaling", c_char_p), ("a_format", c_char_p), ("b_format", c_char_p), ("n", c_int64),
                ("k", c_int64), ("out_dtype", c_char_p), ("accumulate", c_int), ("fast_accum", c_int),
                ("block_m", c_int), ("block_n", c_int), ("stages", c_int), ("multicast", c_int),
                ("raster_m", c_int), ("ordered", c_int), ("scale_layout", c_char_p), ("route", c_char_p),
                ("layout", c_char_p), ("m", c_int64)]


class GemmArgsC(Structure):
    _fields_ = [("a", c_void_p), ("a_bytes", c_int64), ("b", c_void_p), ("b_bytes", c_int64),
                ("d", c_void_p), ("d_bytes", c_int64), ("a_scale", c_void_p), ("a_scale_bytes", c_int64),
                ("b_scale", c_void_p), ("b_scale_bytes", c_int64), ("alpha", c_void_p),
                ("group_offsets", c_void_p), ("group_counts", c_void_p), ("m_max", c_int64),
                ("m_total", c_int64), ("num_groups", c_int), ("max_ctas", c_int), ("a_amax", c_void_p),
                ("b_amax", c_void_p), ("k_total", c_int64), ("workspace", c_void_p),
                ("workspace_bytes", c_int64)]


class CacheEvictPolicyC(Structure):
    _fields_ = [("unused_for_s", c_int64), ("max_bytes", c_int64), ("stale", c_int), ("dry_run", c_int)]


class CacheEvictResultC(Structure):
    _fields_ = [("removed", c_int64), ("kept", c_int64), ("removed_bytes", c_int64), ("kept_bytes", c_int64)]


# qf_log_callback: void (*)(int level, const char* message, void* user).
LogCallbackC = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)

_P = c_void_p  # opaque handles (qf_context*, qf_quantizer*, qf_gemm*)
_PP = POINTER(c_void_p)
SIGNATURES = {
    "qf_last_error": (c_char_p, []),
    "qf_version": (c_char_p, []),
    "qf_context_create": (c_int, [POINTER(c_char_p), c_int, _PP]),
    "qf_context_create_from_json": (c_int, [c_char_p, _PP]),
    "qf_context_destroy": (None, [_P]),
    "qf_context_num_recipes": (c_int, [_P, POINTER(c_int)]),
    "qf_context_recipe_name": (c_int, [_P, c_int, POINTER(c_char_p)]),
    "qf_quantizer_create_ex": (c_int, [_P, c_char_p, c_char_p, c_int, c_int, c_int, _PP]),
    "qf_quantizer_destroy": (None, [_P]),
    "qf_quantizer_num_outputs": (c_int, [_P, POINTER(c_int)]),
    "qf_quantizer_output_info": (c_int, [_P, c_int64, c_int64, c_int, POINTER(BufferInfoC)]),
    "qf_quantizer_grouped_output_info": (c_int, [_P, c_int64, c_int64, c_int, c_int, POINTER(BufferInfoC)]),
    "qf_quantizer_num_inputs": (c_int, [_P, POINTER(c_int)]),
    "qf_quantizer_input_info": (c_int, [_P, c_int, POINTER(BufferInfoC)]),
    "qf_quantizer_workspace_bytes": (c_int, [_P, c_int64, c_int64, c_int, POINTER(c_int64)]),
    "qf_quantizer_prepare": (c_int, [_P, c_char_p]),
    "qf_quantize": (c_int, [_P, POINTER(QuantizeArgsC), c_void_p]),
    "qf_quantizer_history_length": (c_int, [_P, c_char_p, POINTER(c_int)]),
    "qf_quantizer_update_amax_history": (c_int, [_P, c_char_p, POINTER(HistoryArgsC), c_void_p]),
    "qf_gemm_create": (c_int, [POINTER(GemmSpecC), _PP]),
    "qf_context_num_gemms": (c_int, [_P, c_char_p, POINTER(c_int)]),
    "qf_gemm_create_from_recipe": (c_int, [_P, c_char_p, c_int, _PP]),
    "qf_gemm_destroy": (None, [_P]),
    "qf_gemm_describe": (c_char_p, [_P]),
    "qf_gemm_scale_bytes": (c_int, [_P, c_int64, c_int, POINTER(c_int64), POINTER(c_int64)]),
    "qf_gemm_workspace_bytes": (c_int, [_P, POINTER(c_int64)]),
    "qf_gemm_workspace_bytes_for": (c_int, [_P, c_int64, c_int, POINTER(c_int64)]),
    "qf_gemm_route_for": (c_int, [_P, c_int64, c_int, POINTER(c_char_p)]),
    "qf_gemm_prepare": (c_int, [_P, c_char_p]),
    "qf_gemm_run": (c_int, [_P, POINTER(GemmArgsC), c_void_p]),
    "qf_cache_evict": (c_int, [POINTER(CacheEvictPolicyC), POINTER(CacheEvictResultC)]),
    "qf_set_log_callback": (c_int, [LogCallbackC, c_void_p]),
    "qf_set_log_level": (c_int, [c_int]),
    "qf_get_log_level": (c_int, []),
}


PACKAGE_VERSION = "0.6.0"  # python/pyproject.toml's; the CMake project's (tests/python checks both)
SONAME = "libqforge.so.0.6"  # runtime/CMakeLists.txt: SOVERSION major.minor


def candidate_paths():
    """Where libqforge.so is looked for: $QFORGE_LIBRARY alone when set; else beside this file (the
    wheel installs it in the package), the build trees of the checkout this package sits in
    (build*/runtime/, newest first), the lib directories of the installed prefix whose bin/ holds
    the `qforge` on PATH (`cmake --install`), then the system's library path (the SONAME:
    LD_LIBRARY_PATH, ldconfig)."""
    env = os.environ.get("QFORGE_LIBRARY")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve()
    paths = [here.parent / SONAME] if (here.parent / SONAME).exists() else []
    root = here.parents[2]
    if here.parents[1].name == "python" and (root / "CMakeLists.txt").exists():  # a checkout (or pip install -e)
        paths += sorted(root.glob("build*/runtime/libqforge.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    cli = shutil.which("qforge")
    if cli:  # PREFIX/bin/qforge: PREFIX/lib, lib64 or lib/<multiarch> (CMAKE_INSTALL_LIBDIR)
        prefix = Path(cli).resolve().parent.parent
        dirs = [prefix / "lib", prefix / "lib64"] + sorted(prefix.glob("lib/*-linux-*"))
        paths += [d / SONAME for d in dirs if (d / SONAME).exists()]
    return paths + [Path(SONAME)]


NVRTC_SONAME = "libnvrtc.so.13"  # what the wheel's libraries link (a CUDA 13 toolkit)
_nvrtc_preloaded = False


def nvrtc_dirs():
    """The library directories of the nvidia-cuda-nvrtc wheel (nvidia/cu13/lib) on sys.path."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    locations = (spec.submodule_search_locations or []) if spec else []
    return [Path(p) / "cu13" / "lib" for p in locations if (Path(p) / "cu13" / "lib" / NVRTC_SONAME).exists()]


def preload_nvrtc() -> None:
    """For the wheel's libraries (libqforge.so, qforge._C), which link libnvrtc.so.13 and are meant to
    run without a CUDA toolkit: the nvidia-cuda-nvrtc wheel's libnvrtc and libnvrtc-builtins loaded
    by path, before them. Their libnvrtc.so.13 then resolves to it, and NVRTC, which opens its
    builtins library by name at the first compile, finds that one loaded (the system's search would
    not look beside libnvrtc, and a toolkit's could be another version). Without that wheel, nothing:
    the system's NVRTC (LD_LIBRARY_PATH, ldconfig) is used."""
    global _nvrtc_preloaded
    if _nvrtc_preloaded:
        return
    for d in nvrtc_dirs()[:1]:
        builtins = sorted(p for p in d.glob("libnvrtc-builtins.so.*") if ".alt." not in p.name)
        for path in builtins + [d / NVRTC_SONAME]:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _nvrtc_preloaded = True


def bundled(path: Path) -> bool:
    """A library of the installed wheel (in this package's directory), which preload_nvrtc serves."""
    return path.parent == Path(__file__).resolve().parent


def compatible(library_version: str) -> bool:
    """A library this package can drive: the same MAJOR.MINOR (0.x: a minor version may change the API)."""
    return library_version.split(".")[:2] == PACKAGE_VERSION.split(".")[:2]


def load():
    """The library with every signature set; OSError naming each place tried when none loads."""
    tried = []
    for path in candidate_paths():
        try:
            if bundled(path):
                preload_nvrtc()
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        missing = [name for name in SIGNATURES if not hasattr(lib, name)]
        if missing:  # an older build
            tried.append(f"{path}: lacks {', '.join(missing)} (built before this package's API)")
            continue
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        version = lib.qf_version().decode()
        if not compatible(version):
            tried.append(f"{path}: version {version}, this package is {PACKAGE_VERSION} (needs the same major.minor)")
            continue
        return lib
    raise OSError("libqforge.so not found (build the qforge_shared target, or set QFORGE_LIBRARY to its "
                  "path); tried: " + "; ".join(tried))
