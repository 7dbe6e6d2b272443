#!/usr/bin/env python3
"""Which cached kernels a change of the device headers changes, without a GPU.

  sass_diff.py --base BASE_TEMPLATES [--templates TEMPLATES] [--cache DIR] [--filter S] [-v]

Every kernel in a qforge kernel cache (DIR, default $QFORGE_CACHE_DIR) keeps the generated source
it was built from (source.cu, a thin file over the device headers) and its NVRTC options and
kernel names (meta.json). This compiles each such source twice with NVRTC, once against
BASE_TEMPLATES (e.g. `git archive REV templates | tar -x -C /tmp/base` then /tmp/base/templates)
and once against TEMPLATES (default: this checkout's templates/), and compares the two: by SASS
with addresses stripped when nvdisasm is found ($NVDISASM, PATH, the CUDA toolkit, or pip's
nvidia-cuda-nvdisasm), else by the bytes of the CUBIN's code sections (.text.*). Either way the
names NVRTC gives internal-linkage symbols, which change with every compile, are normalized. A
kernel whose code is the same both ways needs no new GPU run for that change; the ones listed as
different do. Only code is compared: kernel attributes outside it (the register count ptxas
records, shared-memory sizes) and constant data are not. Fill the cache first with the kernels
of interest (`qforge prewarm recipes`, `qforge gemm ...`); entries without a CUBIN are skipped.

Prints one line per differing kernel (and per kernel that fails to compile) and a summary; exits
0 when every compared kernel is the same, 1 when some differ, 2 on an error (no cache entries, a
compile that fails, no NVRTC).

  sass_diff.py --base-cache BASE_CACHE [--cache DIR] [--filter S] [-v]

compares two caches instead, without compiling: every quantize kernel of DIR's entries with the
same kernel in BASE_CACHE's, e.g. a cache prewarmed by this build against one prewarmed by an
older build whose entries grouped the kernels into other programs. A kernel is "the same" when
its arch, NVRTC options, name expression and the generated configs that expression uses
(qf_gen's structs, with their bases) are equal, whatever else its program holds. Compared: its
code section (.text.<kernel>) byte for byte and its attributes (.nv.info.<kernel>: launch
bounds, registers, frame and parameter sizes, ...; the parameter bank's symbol index, which
numbers the program's symbols, left out), plus code sections of functions that are not kernels,
listed if any. Exits 0 when every kernel of DIR was found and is the same, 1 otherwise.
"""
import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class SassDiffError(Exception):
    pass


def cuda_roots():
    return [r for r in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if r]


def load_nvrtc(path=None):
    """libnvrtc: PATH, $QFORGE_NVRTC, the CUDA toolkit's lib64, or the loader's search."""
    cands = [path, os.environ.get("QFORGE_NVRTC")]
    for root in cuda_roots():
        cands += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")))
    cands.append(ctypes.util.find_library("nvrtc"))
    for c in cands:
        if c:
            try:
                return ctypes.CDLL(c)
            except OSError:
                continue
    raise SassDiffError("libnvrtc not found: set QFORGE_NVRTC or CUDA_HOME")


def find_nvdisasm(path=None):
    cands = [path, os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    cands += [os.path.join(root, "bin", "nvdisasm") for root in cuda_roots()]
    try:  # pip install nvidia-cuda-nvdisasm
        import nvidia  # noqa: PLC0415

        for p in nvidia.__path__:
            cands += sorted(glob.glob(os.path.join(p, "*", "bin", "nvdisasm")))
    except ImportError:
        pass
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def compile_cubin(nvrtc, source, options, names, include_dir):
    """CUBIN of `source` compiled with `options` and -I include_dir, the kernels `names` kept."""
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"source.cu", 0, None, None) != 0:
        raise SassDiffError("nvrtcCreateProgram failed")
    try:
        for n in names:
            nvrtc.nvrtcAddNameExpression(prog, n.encode())
        opts = [o.encode() for o in list(options) + ["-I" + str(include_dir)]]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        if nvrtc.nvrtcCompileProgram(prog, len(opts), arr) != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise SassDiffError(f"compile against {include_dir} failed:\n{log.value.decode(errors='replace')[:2000]}")
        size = ctypes.c_size_t()
        if nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0 or size.value == 0:
            raise SassDiffError("no CUBIN (options without a real sm_ architecture?)")
        buf = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetCUBIN(prog, buf)
        return buf.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


_ADDRESS = re.compile(r"/\*[0-9a-fx]+\*/")
# NVRTC's names of internal-linkage symbols: _INTERNAL_<hex>_<n>_source_cu_<per-compile hex>_<n>...
_INTERNAL = re.compile(r"_INTERNAL_[0-9a-f]{8}_\d+_\w*?_cu_[0-9a-f]{8}_\d+")


def normalize_names(text):
    return _INTERNAL.sub("_INTERNAL_", text)


def normalize_sass(text):
    """nvdisasm's listing without instruction addresses, blank lines and per-compile internal
    names (a change that moves code but keeps every instruction and label in order compares
    equal)."""
    out = []
    for line in text.splitlines():
        line = normalize_names(_ADDRESS.sub("", line)).strip()
        if line:
            out.append(" ".join(line.split()))
    return "\n".join(out)


def code_sections(cubin):
    """[(section name, bytes)] of the CUBIN's code sections (ELF64 .text*), names normalized."""
    return sorted((normalize_names(name), data) for name, data in elf_sections(cubin).items()
                  if name.startswith(".text"))


def disassemble(nvdisasm, cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        r = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True)
    if r.returncode != 0:
        raise SassDiffError(f"nvdisasm failed: {r.stderr.strip()[:500]}")
    return normalize_sass(r.stdout)


def read_entries(cache_dir, with_image=True):
    """(entry dir, meta.json, source.cu, image.bin or None) of every readable entry below a cache
    directory, in path order; a stray or a damaged entry is skipped (`qforge verify` names those)."""
    for meta_path in sorted(glob.glob(os.path.join(cache_dir, "**", "meta.json"), recursive=True)):
        entry = os.path.dirname(meta_path)
        try:
            meta = json.load(open(meta_path))
            source = open(os.path.join(entry, "source.cu")).read()
            image = open(os.path.join(entry, "image.bin"), "rb").read() if with_image else None
        except (OSError, ValueError):
            continue
        yield entry, meta, source, image


def cache_entries(cache_dir, text_filter=""):
    """(label, source, options, names) of every entry that holds its source and a CUBIN, sorted
    by label."""
    out = []
    for entry, meta, source, _ in read_entries(cache_dir, with_image=False):
        if meta.get("kind", "cubin") != "cubin":
            continue  # PTX entries (an architecture NVRTC could not target)
        names = list(meta.get("lowered_names", {}).keys())
        md = meta.get("metadata", {})
        label = " ".join(str(v) for k, v in sorted(md.items()) if k != "kind") or os.path.basename(entry)
        kernels = ", ".join(sorted({n.split("<")[0].split("::")[-1] for n in names}))
        label = f"[{md.get('kind', '?')}] {label} ({kernels}; {meta.get('target', meta.get('arch', '?'))})"
        if text_filter and text_filter not in label:
            continue
        out.append((label, source, meta.get("options", []), names))
    return sorted(out)


def compare(entries, base_dir, new_dir, nvrtc, nvdisasm=None, verbose=False, log=print):
    """(same, different labels, failed labels) over `entries`, comparing SASS (nvdisasm) or the
    CUBINs' code sections."""
    same, differ, failed = 0, [], []
    for label, source, options, names in entries:
        try:
            a = compile_cubin(nvrtc, source, options, names, base_dir)
            b = compile_cubin(nvrtc, source, options, names, new_dir)
            a, b = (disassemble(nvdisasm, a), disassemble(nvdisasm, b)) if nvdisasm else (code_sections(a), code_sections(b))
        except SassDiffError as e:
            failed.append(label)
            log(f"error   {label}: {str(e).splitlines()[0]}")
            continue
        if a == b:
            same += 1
            if verbose:
                log(f"same    {label}")
        else:
            differ.append(label)
            log(f"differs {label}")
    return same, differ, failed


_STRUCT = re.compile(r"^\s*struct (\w+)(?: : (\w+))? \{$")


def gen_structs(source):
    """{name: (base or None, text)} of the generated source's structs (namespace qf_gen)."""
    out, cur, base, lines = {}, None, None, []
    for line in source.splitlines():
        m = _STRUCT.match(line)
        if cur is None and m:
            cur, base, lines = m.group(1), m.group(2), [line.strip()]
        elif cur is not None:
            lines.append(line.strip())
            if line.strip() == "};":
                out[cur] = (base, "\n".join(lines))
                cur = None
    return out


def kernel_identity(target, options, expr, structs):
    """What determines a kernel's machine code given the headers: arch, options, its name
    expression and the definitions of the configs it names (bases included)."""
    todo, seen = list(re.findall(r"qf_gen::(\w+)", expr)), {}
    while todo:
        n = todo.pop()
        if n in seen or n not in structs:
            continue
        base, text = structs[n]
        seen[n] = text
        if base:
            todo.append(base)
    return (target, tuple(options), expr, tuple(sorted(seen.items())))


def elf_sections(cubin):
    """{section name: bytes} of an ELF64 CUBIN, names as they are."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise SassDiffError("not an ELF64 CUBIN")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = cubin[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for name_off, sh_type, _, _, off, size, *_ in headers:
        name = names[name_off:names.index(b"\0", name_off)].decode(errors="replace")
        out[name] = b"" if sh_type == 8 else cubin[off:off + size]  # SHT_NOBITS: no bytes
    return out


_EIATTR_PARAM_CBANK = 0x0A  # (symbol index of the parameter bank, offset, size)


def nv_info(data):
    """[(attribute, value bytes)] of an .nv.info.<kernel> section, the parameter bank's symbol
    index dropped (it numbers the program's symbols, not the kernel)."""
    out, i = [], 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 0x04:  # EIFMT_SVAL: u16 size, then the value
            size, = struct.unpack_from("<H", data, i + 2)
            val = data[i + 4:i + 4 + size]
            i += 4 + size
        elif fmt in (0x02, 0x03):  # EIFMT_BVAL / EIFMT_HVAL: the value in the next 2 bytes
            val = data[i + 2:i + 4]
            i += 4
        else:  # EIFMT_NVAL
            val = b""
            i += 2
        if attr == _EIATTR_PARAM_CBANK:
            val = val[4:]
        out.append((attr, val))
    return out


def cache_kernels(cache_dir, text_filter=""):
    """{identity: (label, code bytes, attributes)} of every quantize kernel in a cache, and the
    names of code sections that belong to no kernel."""
    out, loose = {}, []
    for _, meta, source, image in read_entries(cache_dir):
        md = meta.get("metadata", {})
        if meta.get("kind", "cubin") != "cubin" or md.get("kind") != "quantize":
            continue
        label = " ".join(str(v) for k, v in sorted(md.items()) if k != "kind")
        if text_filter and text_filter not in label:
            continue
        secs = elf_sections(image)
        structs = gen_structs(source)
        lowered = meta.get("lowered_names", {})
        for expr, sym in lowered.items():
            ident = kernel_identity(meta.get("target", meta.get("arch")), meta.get("options", []), expr, structs)
            kind = expr.split("<")[0].split("::")[-1]
            out[ident] = (f"{label} {kind}", secs.get(".text." + sym), nv_info(secs.get(".nv.info." + sym, b"")))
        kernels = {".text." + sym for sym in lowered.values()}
        loose += [f"{label}: {n}" for n in secs if n.startswith(".text") and n not in kernels]
    return out, loose


def compare_caches(base_cache, cache, text_filter="", verbose=False, log=print):
    base, base_loose = cache_kernels(base_cache)  # the filter picks the kernels to compare, not their matches
    new, new_loose = cache_kernels(cache, text_filter)
    same, differ, missing = 0, [], []
    for ident, (label, code, info) in sorted(new.items(), key=lambda kv: kv[1][0]):
        if ident not in base:
            missing.append(label)
            log(f"missing {label}: no such kernel in {base_cache}")
            continue
        _, bcode, binfo = base[ident]
        what = [w for w, a, b in (("code", code, bcode), ("attributes", info, binfo)) if a != b or a is None]
        if what:
            differ.append(label)
            log(f"differs {label}: {', '.join(what)}")
        else:
            same += 1
            if verbose:
                log(f"same    {label}")
    for n in base_loose + new_loose:
        log(f"note: a code section of no kernel: {n}")
    return same, differ, missing, len(base)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="the device headers to compare against (a templates/ directory)")
    ap.add_argument("--base-cache", help="a cache to compare the kernels of --cache with, compiling nothing")
    ap.add_argument("--templates", default=str(REPO / "templates"), help="default: this checkout's templates/")
    ap.add_argument("--cache", default=os.environ.get("QFORGE_CACHE_DIR"), help="default: $QFORGE_CACHE_DIR")
    ap.add_argument("--filter", default="", help="only entries whose label contains this text")
    ap.add_argument("--nvdisasm", default=None)
    ap.add_argument("--cubin", action="store_true", help="compare the CUBINs' code sections even where nvdisasm is found")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list the kernels that are the same")
    args = ap.parse_args(argv)
    if bool(args.base) == bool(args.base_cache):
        ap.error("give --base (headers) or --base-cache (a cache), one of them")
    if args.base_cache:
        try:
            if not args.cache:
                raise SassDiffError("no cache: --cache DIR or QFORGE_CACHE_DIR")
            same, differ, missing, nbase = compare_caches(args.base_cache, args.cache, args.filter, args.verbose)
        except SassDiffError as e:
            print(f"sass_diff: {e}", file=sys.stderr)
            return 2
        print(f"sass_diff: {same + len(differ) + len(missing)} quantize kernels of {args.cache} against {nbase} of "
              f"{args.base_cache} by code section and attributes: {same} the same, {len(differ)} different, "
              f"{len(missing)} not found")
        return 1 if differ or missing or same == 0 else 0
    try:
        if not args.cache:
            raise SassDiffError("no cache: --cache DIR or QFORGE_CACHE_DIR")
        for d in (args.base, args.templates):
            if not os.path.isdir(os.path.join(d, "qforge")):
                raise SassDiffError(f"{d}: expected a templates directory (with qforge/ inside)")
        entries = cache_entries(args.cache, args.filter)
        if not entries:
            raise SassDiffError(f"{args.cache}: no cache entry with its source" +
                                (f" matching '{args.filter}'" if args.filter else ""))
        nvdisasm = None if args.cubin else find_nvdisasm(args.nvdisasm)
        how = f"SASS ({nvdisasm})" if nvdisasm else "CUBIN code sections (no nvdisasm found)"
        same, differ, failed = compare(entries, args.base, args.templates, load_nvrtc(), nvdisasm, args.verbose)
    except SassDiffError as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 2
    print(f"sass_diff: {len(entries)} kernels compared by {how}: {same} the same, {len(differ)} different" +
          (f", {len(failed)} failed to compile" if failed else ""))
    return 2 if failed else 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
