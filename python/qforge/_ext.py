"""Finds and loads qforge._C, the compiled core (python/src/ext.cpp).

Looked for: $QFORGE_EXTENSION (a path to the module file) alone when set; else next to this
package (an installed wheel); else the build trees of the checkout this package sits in
(build*/python/qforge/_C*.so, newest first). Once loaded, its log messages go to Python's logging
(qforge/_log.py): it links its own copy of the runtime, so its own log sink.
"""
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

from . import _capi, _log

_module = None


def candidate_paths():
    env = os.environ.get("QFORGE_EXTENSION")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    paths = [p for s in suffixes for p in here.glob("_C" + s)]
    root = here.parents[1]
    if here.parent.name == "python" and (root / "CMakeLists.txt").exists():
        found = [p for s in suffixes for p in root.glob("build*/python/qforge/_C" + s)]
        paths += sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    return paths


def load():
    """qforge._C; ImportError naming every place tried when none loads."""
    global _module
    if _module is not None:
        return _module
    tried = []
    for path in candidate_paths():
        if not path.exists():
            tried.append(f"{path}: no such file")
            continue
        spec = importlib.util.spec_from_file_location("qforge._C", path)
        try:
            if _capi.bundled(path):
                _capi.preload_nvrtc()
            module = importlib.util.module_from_spec(spec)
            sys.modules["qforge._C"] = module
            spec.loader.exec_module(module)
        except ImportError as e:
            sys.modules.pop("qforge._C", None)
            tried.append(f"{path}: {e}")
            continue
        _log.install_extension(module)
        _module = module
        return module
    raise ImportError("qforge: the compiled core qforge._C was not found (build it: cmake with nanobind installed, "
                      "target qforge_ext; or install the wheel). Tried: " + ("; ".join(tried) or "nothing"))
