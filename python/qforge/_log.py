"""The library's messages in Python's `logging`: the logger "qforge".

libqforge.so and the compiled core qforge._C each link their own copy of the runtime and so each
has its own log sink (runtime/log.h); both are bridged here, each when it is loaded
(qforge.library(), _ext.load). A message crosses when its level is within the library's threshold:
QFORGE_LOG_LEVEL (off, error, warn, info, debug; default warn), or set_log_level. Python's logging
then filters it as any record: by the "qforge" logger's level and its handlers'.

Levels: the C API's QF_LOG_ERROR, _WARN, _INFO, _DEBUG become logging.ERROR (40), WARNING (30),
INFO (20), DEBUG (10). With no logging handler configured anywhere (logger.hasHandlers() false), a
record the logger would emit is written to stderr as the library writes it itself,
"qforge: <level>: <message>", instead of by Python's last-resort handler (which drops the prefix
and anything below WARNING).

Threads: the library calls the bridge on whichever thread compiles or loads a kernel, possibly
several at once; a ctypes callback (and qforge._C's, with nanobind's gil_scoped_acquire) takes the
GIL itself, and the library never calls it while holding a lock of its own. Replacing a callback
waits for calls in progress on other threads, so it is done with the GIL released (ctypes.CDLL
releases it; qforge._C releases it around the swap). At exit the bridges are removed (the library
goes back to stderr), so no compiling thread calls into a finalizing interpreter.
"""
import atexit
import logging
import sys
import threading

from . import _capi

logger = logging.getLogger("qforge")

# The C API's qf_log_level values.
OFF, ERROR, WARN, INFO, DEBUG = 0, 1, 2, 3, 4
_PY_LEVEL = {ERROR: logging.ERROR, WARN: logging.WARNING, INFO: logging.INFO, DEBUG: logging.DEBUG}
_NAME = {OFF: "off", ERROR: "error", WARN: "warn", INFO: "info", DEBUG: "debug"}
_BY_NAME = {"off": OFF, "error": ERROR, "warn": WARN, "warning": WARN, "info": INFO, "debug": DEBUG}
_STDERR_WORD = {ERROR: "error", WARN: "warning", INFO: "info", DEBUG: "debug"}  # runtime/log.cpp's words

_lock = threading.Lock()
_level = None  # the threshold set_log_level gave (a C API level), applied to each library as it loads
_libraries = []  # the loaded libqforge.so (ctypes) with the bridge installed
_extensions = []  # the loaded qforge._C with the bridge installed


def emit(level: int, message: str) -> None:
    """One library message into the "qforge" logger. Never raises (it runs under C frames)."""
    try:
        py_level = _PY_LEVEL.get(level, logging.WARNING)
        if not logger.isEnabledFor(py_level):
            return
        if logger.hasHandlers():
            logger.log(py_level, "%s", message)
        else:  # no logging configured: the library's own stderr line
            sys.stderr.write(f"qforge: {_STDERR_WORD.get(level, 'warning')}: {message}\n")
            sys.stderr.flush()
    except Exception:  # noqa: BLE001 - an exception cannot cross into the library
        pass


def _from_c(level, message, user):
    emit(level, (message or b"").decode("utf-8", errors="replace"))


_c_callback = _capi.LogCallbackC(_from_c)  # module-level: alive as long as the library may call it


def to_c_level(level) -> int:
    """A threshold as the C API's level: a name (off, error, warn / warning, info, debug; any case)
    or a logging level (logging.INFO, 20; a value between levels takes the next more severe one,
    above ERROR: off). ValueError otherwise."""
    if isinstance(level, str):
        if level.lower() in _BY_NAME:
            return _BY_NAME[level.lower()]
        raise ValueError(f"level: expected off, error, warn, info, debug or a logging level, got {level!r}")
    if isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f"level: expected a name or a logging level (an int), got {level!r}")
    if level <= logging.DEBUG:
        return DEBUG
    if level <= logging.INFO:
        return INFO
    if level <= logging.WARNING:
        return WARN
    if level <= logging.ERROR:
        return ERROR
    return OFF


def to_py_level(level: int) -> int:
    """A C API level as a logging level."""
    return _PY_LEVEL[level]


def level_name(level: int) -> str:
    return _NAME.get(level, str(level))


def install_library(lib) -> None:
    """Routes libqforge.so's messages here (called by _capi.load); applies set_log_level's threshold."""
    with _lock:  # the signatures: _capi.SIGNATURES
        if _level is not None:
            lib.qf_set_log_level(_level)
        lib.qf_set_log_callback(_c_callback, None)
        _libraries.append(lib)


def install_extension(module) -> None:
    """Routes qforge._C's messages here (called by _ext.load); applies set_log_level's threshold."""
    if not hasattr(module, "set_log_callback"):  # a core built before the bridge
        return
    with _lock:
        module.set_log_callback(emit, _level)
        _extensions.append(module)


def set_level(level: int) -> None:
    """The threshold of every loaded library (and of those loaded later)."""
    global _level
    with _lock:
        _level = level
        for lib in _libraries:
            lib.qf_set_log_level(level)
        for module in _extensions:
            module.set_log_callback(emit, level)


def get_level():
    """The threshold set_log_level gave, else the loaded libqforge.so's (QFORGE_LOG_LEVEL), else None."""
    with _lock:
        if _level is not None:
            return _level
        return _libraries[0].qf_get_log_level() if _libraries else None


@atexit.register
def _uninstall() -> None:
    for lib in _libraries:
        lib.qf_set_log_callback(_capi.LogCallbackC(), None)  # a NULL callback: back to stderr
    for module in _extensions:
        try:
            module.set_log_callback(None)
        except Exception:  # noqa: BLE001 - at exit: nothing to report to
            pass
