"""pytest configuration for the numerics tier.

Run:  python3 -m pytest tests/numerics --qforge-bin=<cmake build dir>
The helper executables are built by tests/CMakeLists.txt into <build>/tests/.
"""
import os
import subprocess
import tempfile

import numpy as np
import pytest


def pytest_addoption(parser):
    parser.addoption("--qforge-bin", action="store", default=os.environ.get("QFORGE_BIN"),
                     help="CMake build directory of qforge (holds tests/qf_convert)")


def _find_tool(bin_dir, name):
    for rel in (os.path.join("tests", name), name, os.path.join("tests", "tools", name)):
        path = os.path.join(bin_dir, rel)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="session")
def qforge_bin(request):
    bin_dir = request.config.getoption("--qforge-bin")
    if not bin_dir:
        pytest.fail("--qforge-bin=<cmake build dir> (or QFORGE_BIN) is required")
    return os.path.abspath(bin_dir)


@pytest.fixture(scope="session")
def qf_convert(qforge_bin):
    """qf_convert(fmt, values, bf16_input=False) -> np.ndarray of the encoded elements
    (uint8, or uint16 for bf16/f16). `values` is float32 (or uint16 bf16 bit patterns when
    bf16_input)."""
    tool = _find_tool(qforge_bin, "qf_convert")
    if tool is None:
        pytest.fail(f"qf_convert not found under {qforge_bin}/tests (build the tests first)")

    def run(fmt, values, bf16_input=False):
        values = np.ascontiguousarray(values, dtype=np.uint16 if bf16_input else np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
            values.astype(values.dtype.newbyteorder("<")).tofile(src)
            cmd = [tool] + (["--bf16-input"] if bf16_input else []) + [fmt, src, dst]
            subprocess.run(cmd, check=True)
            wide = fmt in ("bf16", "f16")
            out = np.fromfile(dst, dtype=np.dtype("<u2") if wide else np.dtype(np.uint8))
        assert out.size == values.size
        return out.astype(np.uint16 if wide else np.uint8)

    return run


@pytest.fixture(scope="session")
def qforge(qforge_bin):
    """Path of the built qforge CLI."""
    path = os.path.join(qforge_bin, "tools", "qforge")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"qforge not found at {path} (build the qforge target first)")
    return path
