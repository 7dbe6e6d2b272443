"""The wheel's `qforge` command: runs the CLI binary installed in the package (qforge/bin/qforge).

The binary links libnvrtc.so.13, and NVRTC opens its builtins library by name at the first
compile: with the nvidia-cuda-nvrtc wheel installed, its library directory goes first on
LD_LIBRARY_PATH (else the system's NVRTC is used, as for a CMake install).
"""
import os
import sys
from pathlib import Path

from . import _capi


def main() -> None:
    exe = Path(__file__).resolve().parent / "bin" / "qforge"
    if not exe.exists():
        sys.exit(f"qforge: {exe} is missing (this package was not installed from the wheel; "
                 "a CMake build has the CLI in <build>/tools/qforge)")
    dirs = [str(d) for d in _capi.nvrtc_dirs()[:1]]
    if dirs:
        rest = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + ([rest] if rest else []))
    os.execv(str(exe), ["qforge"] + sys.argv[1:])
