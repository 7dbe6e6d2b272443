"""The library's log in Python's logging (python/qforge/_log.py), without a GPU.

Each case runs in a fresh process with an empty kernel cache of its own (QFORGE_CACHE_DIR is read
once per process, and the log's threshold and callback are process-wide), compiles kernels with
prepare("sm_90a") and looks at the records the "qforge" logger received: the compile's INFO record
names its kernels and milliseconds; the library's threshold (QFORGE_LOG_LEVEL, set_log_level) and
the logger's level each filter; records arrive from the threads that compile, on libqforge.so and
on qforge._C (its own copy of the runtime, so its own log sink); with no handler configured, the
library's own stderr line.

Run:  QFORGE_LIBRARY=BUILD/runtime/libqforge.so QFORGE_EXTENSION=BUILD/python/qforge/_C*.so \
      python3 -m pytest -q tests/python/test_log.py
"""
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import qforge  # noqa: E402
from qforge import _log  # noqa: E402

RECIPES = ROOT / "recipes"

# The child's preamble: every "qforge" record into RECORDS; done() prints them as JSON.
PREAMBLE = """
import json, logging, sys, threading
import qforge
RECORDS = []
class Collect(logging.Handler):
    def emit(self, r):
        RECORDS.append({"name": r.name, "level": r.levelno, "thread": r.threadName, "message": r.getMessage()})
def collect(level=logging.DEBUG):
    logging.getLogger().setLevel(level)
    logging.getLogger().addHandler(Collect())
def quantizer(recipe, role="linear:input", usage="inference"):
    return qforge.Context(%r + "/" + recipe + ".json").quantizer(role, usage=usage)
def done():
    print("RECORDS " + json.dumps(RECORDS))
""" % str(RECIPES)


def run(tmp_path, body, **env_extra):
    """Runs PREAMBLE + body in a fresh process; (records, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "QFORGE_LOG_LEVEL"}
    env.update(QFORGE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT / "python"), **env_extra)
    p = subprocess.run([sys.executable, "-c", PREAMBLE + textwrap.dedent(body)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("RECORDS ")]
    return (json.loads(lines[-1][len("RECORDS "):]) if lines else None), p.stderr


def compiles(records):
    return [r for r in records if r["message"].startswith("compiled quantize kernel ")]


def test_a_compile_is_an_info_record_naming_its_kernels_and_milliseconds(tmp_path):
    records, _ = run(tmp_path, """
        collect()
        qforge.set_log_level("info")
        q = quantizer("mxfp8")
        q.prepare("sm_90a")
        q.prepare("sm_90a")  # a cache hit: debug, below the threshold
        done()
    """)
    assert len(records) == 2, records  # the program for any tiles, then the one for interior tiles
    for r, tiles in zip(records, ("", "tiles interior, ")):
        assert r["name"] == "qforge" and r["level"] == logging.INFO, r
        assert re.fullmatch(r"compiled quantize kernel \(form separate, input bf16, recipe mxfp8, role linear:input, "
                            + tiles + r"usage inference\) "
                            r"\[qf::cast_kernel<.*>\] for sm_90a in \d+ ms \(NVRTC [0-9.]+, key [0-9a-f]+\)",
                            r["message"]), r["message"]


def test_the_library_threshold_and_the_logger_level_both_filter(tmp_path):
    records, _ = run(tmp_path, """
        collect()
        qforge.set_log_level("warn")                       # the library sends no compile
        quantizer("mxfp8").prepare("sm_90a")
        qforge.set_log_level(logging.INFO)                 # it sends, the logger passes
        quantizer("fp8_rowwise").prepare("sm_90a")
        logging.getLogger("qforge").setLevel(logging.WARNING)  # it sends, the logger drops
        quantizer("current_scaling").prepare("sm_90a")
        qforge.set_log_level("debug")                      # cache hits too, at DEBUG
        quantizer("mxfp8").prepare("sm_90a")
        print("LEVEL", qforge.get_log_level())
        done()
    """)
    assert [(r["level"], re.search(r"recipe (\S+),", r["message"]).group(1)) for r in records] == [
        (logging.INFO, "fp8_rowwise"), (logging.INFO, "fp8_rowwise"), (logging.DEBUG, "mxfp8"), (logging.DEBUG, "mxfp8")], records
    assert records[2]["message"].startswith("memory cache hit: quantize kernel"), records[2]


def test_qforge_log_level_sets_the_library_threshold_and_logging_filters(tmp_path):
    body = """
        collect(logging.%s)
        quantizer("mxfp8").prepare("sm_90a")
        print("LEVEL", qforge.get_log_level())
        done()
    """
    records, _ = run(tmp_path / "a", body % "INFO", QFORGE_LOG_LEVEL="info")
    assert len(compiles(records)) == 2 and records[0]["level"] == logging.INFO, records
    records, _ = run(tmp_path / "b", body % "WARNING", QFORGE_LOG_LEVEL="info")
    assert records == [], records  # sent by the library, dropped by the root logger's WARNING
    records, _ = run(tmp_path / "c", body % "DEBUG")
    assert records == [], records  # the default threshold: warn


def test_without_a_handler_the_library_line_goes_to_stderr(tmp_path):
    # A bad QFORGE_LOG_LEVEL is a library warning, read when the level is first asked for.
    records, err = run(tmp_path, """
        print("LEVEL", qforge.get_log_level())
        qforge.set_log_level("info")
        quantizer("mxfp8").prepare("sm_90a")
        done()
    """, QFORGE_LOG_LEVEL="loud")
    assert records == []
    lines = err.splitlines()
    assert 'qforge: warning: QFORGE_LOG_LEVEL: expected off, error, warn, info or debug, got "loud"; using warn' in lines
    assert any(re.match(r"qforge: info: compiled quantize kernel .* in \d+ ms", line) for line in lines), err
    records, _ = run(tmp_path / "handled", "collect(); qforge.get_log_level(); done()", QFORGE_LOG_LEVEL="loud")
    assert [(r["level"], r["message"][:17]) for r in records] == [(logging.WARNING, "QFORGE_LOG_LEVEL:")], records


def test_records_come_from_every_compiling_thread(tmp_path):
    records, _ = run(tmp_path, """
        collect()
        qforge.set_log_level("info")
        qs = [quantizer(recipe) for recipe in ("mxfp8", "fp8_rowwise", "current_scaling")]
        errors = []
        def work(q):
            try:
                q.prepare("sm_90a")
            except Exception as e:
                errors.append(e)
        threads = [threading.Thread(target=work, args=(q,), name=f"compiler-{i}") for i, q in enumerate(qs)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        quantizer("delayed_scaling").prepare("sm_90a")  # the main thread after them
        done()
    """)
    got = sorted((r["thread"], re.search(r"recipe (\S+),", r["message"]).group(1)) for r in compiles(records))
    assert got == sorted(2 * [("MainThread", "delayed_scaling"), ("compiler-0", "mxfp8"), ("compiler-1", "fp8_rowwise"),
                              ("compiler-2", "current_scaling")]), got  # each: any tiles, interior tiles


def extension_env():
    if not os.environ.get("QFORGE_EXTENSION"):
        try:
            from qforge import _ext
            _ext.load()
        except ImportError as e:
            pytest.skip(f"qforge._C not built: {e}")
    return {}


def test_the_compiled_core_logs_through_its_own_sink(tmp_path):
    extension_env()
    records, _ = run(tmp_path, """
        collect()
        qforge.set_log_level("info")       # before qforge._C is loaded: applied when it is
        from qforge import _ext
        C = _ext.load()
        q = C.Context([%r]).quantizer("linear:input", None, "bf16", "inference", False)
        t = threading.Thread(target=q.prepare, args=("sm_90a",), name="core")
        t.start(); t.join()
        qforge.set_log_level("warn")       # both sinks
        C.Context([%r]).quantizer("linear:weight", None, "bf16", "inference", False).prepare("sm_90a")
        quantizer("fp8_rowwise", "linear:weight").prepare("sm_90a")
        done()
    """ % (str(RECIPES / "nvfp4.json"), str(RECIPES / "nvfp4.json")))
    assert [(r["thread"], r["level"]) for r in records] == 2 * [("core", logging.INFO)], records
    assert re.match(r"compiled quantize kernel \(form all, input bf16, recipe nvfp4, role linear:input, usage inference\) "
                    r"\[.*\] for sm_90a in \d+ ms", records[0]["message"]), records[0]


def test_the_compiled_core_callback_checks_its_level():
    extension_env()
    from qforge import _ext
    C = _ext.load()
    with pytest.raises(ValueError, match="level: expected 0 \\(off\\) .. 4 \\(debug\\), got 7"):
        C.set_log_callback(_log.emit, 7)


def test_levels_by_name_and_by_logging_level():
    assert [_log.to_c_level(v) for v in ("off", "ERROR", "warn", "Warning", "info", "debug")] == [0, 1, 2, 2, 3, 4]
    assert [_log.to_c_level(v) for v in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                         logging.CRITICAL, 5, 25)] == [4, 3, 2, 1, 0, 4, 2]
    for bad in ("loud", 2.0, None, True):
        with pytest.raises(qforge.UserError, match="level: expected"):
            qforge.set_log_level(bad)
