"""Other libraries' messages that are not the user's business, defined once (stdlib only).

ddprobe prevents what it can at the source (the matmul precision it sets where fp32 runs on a GPU, compile turned
off where it buys nothing); what it cannot prevent is listed here by exact message and kept out of the terminal:

- ``FOREIGN_WARNINGS``: Python warnings (torch, Inductor) matched by their exact message text; ``install`` sends them
  to the run's log file instead of stderr (``-v``: shown as well);
- ``quiet_stderr``: C++ libraries that write to the process's stderr directly (Kineto's "profiler_start" lines
  while ``torch.profiler`` counts kernels): stderr is pointed at the log file for the duration.

``log_path()`` names the file (``DDPROBE_FOREIGN_LOG``, else ``ddprobe-foreign.log`` in the temp folder); a command
that kept anything there says so in one line (``kept``).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings

# (exact message as a regular expression anchored at both ends, the library that says it). Inductor's online-softmax
# message starts with a newline and wraps its lines (torch 2.8-2.12's lowering.py): whitespace is matched as such.
FOREIGN_WARNINGS: tuple[tuple[str, str], ...] = (
    (r"\s*TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled\..*", "torch"),
    (r"\s*Online softmax is disabled on the fly since Inductor decides to\s+split the reduction\..*",
     "torch._inductor"),
)
_installed: dict = {}


def log_path() -> str:
    return os.environ.get("DDPROBE_FOREIGN_LOG") or os.path.join(tempfile.gettempdir(), "ddprobe-foreign.log")


def is_foreign(message: str) -> bool:
    return any(re.fullmatch(p, message, flags=re.S) for p, _ in FOREIGN_WARNINGS)


def _log(text: str) -> None:
    try:
        with open(log_path(), "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        _installed["kept"] = _installed.get("kept", 0) + 1
    except OSError:  # an unwritable log never breaks a run: the message is dropped, as it would be filtered
        pass


def install(verbose: bool = False) -> None:
    """Route the foreign warnings to the log file (``verbose``: to stderr as well); every other warning unchanged.
    Again after ``warnings.catch_warnings`` put another hook back: the hook is put in front of whatever is there."""
    _installed["verbose"] = verbose
    if getattr(warnings.showwarning, "_ddprobe_foreign", False):
        return
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if is_foreign(text):
            _log(f"{category.__name__}: {text} ({filename}:{lineno})")
            if not _installed.get("verbose"):
                return
        shown(message, category, filename, lineno, file, line)
    showwarning._ddprobe_foreign = True
    warnings.showwarning = showwarning
    for pattern, _ in FOREIGN_WARNINGS:  # "always": a warning torch raised once elsewhere is still logged
        warnings.filterwarnings("always", message=pattern)


def kept() -> str:
    """One line naming the log when this process kept foreign messages in it ("" when none)."""
    n = _installed.get("kept", 0)
    return f"{n} third-party message(s) kept in {log_path()} (-v shows them)" if n else ""


@contextlib.contextmanager
def quiet_stderr():
    """Point the process's stderr (fd 2: C++ libraries write there directly) at the log file for the duration;
    with ``install(verbose=True)`` nothing is redirected."""
    if _installed.get("verbose"):
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        fd = os.open(log_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    size = os.fstat(fd).st_size
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if os.fstat(fd).st_size > size:
            _installed["kept"] = _installed.get("kept", 0) + 1
        os.close(fd)
