"""Starting, supervising and stopping one lmr-oobd process."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

from lm_resiliency.errors import LmrIOError, LmrTimeoutError, UnsupportedError

__all__ = ["Daemon", "find_daemon"]


def find_daemon(explicit: Optional[str] = None) -> str:
    """The lmr-oobd executable: `explicit`, else next to this Python (a venv or a pip
    install puts it there), else on PATH."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise UnsupportedError(f"lmr-oobd at {explicit} is not an executable")
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "lmr-oobd")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("lmr-oobd")
    if found:
        return found
    raise UnsupportedError("lmr-oobd is not installed: build lm_resiliency where Gloo is available "
                           "(Debian: apt-get install libgloo-dev) to enable hang detection")


def _tail(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


class Daemon:
    """Starts lmr-oobd; ``wait_ready()`` waits (bounded) for its readiness line. From its
    start the daemon watches this process, so the progress record is created after it: a
    process killed at any moment leaves no record behind. ``on_exit(code, log)`` runs on a
    supervisor thread when it exits after readiness without ``stop()`` having been called.
    `token`: the job's secret (the daemon's environment)."""

    def __init__(self, executable: str, args: list[str], log_path: str, on_exit: Callable[[int, str], None],
                 token: str) -> None:
        self.log_path = log_path
        self._stopping = False
        self._on_exit = on_exit
        read_fd, write_fd = os.pipe()
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [executable, *args, f"--ready-fd={write_fd}", f"--parent-pid={os.getpid()}"],
                    pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    env={**os.environ, "LMR_OOB_TOKEN": token},  # not argv: other users can read that
                    start_new_session=True)  # a Ctrl-C of the launcher reaches the trainer, which stops it
        except OSError as e:
            os.close(read_fd)
            raise LmrIOError(f"cannot start lmr-oobd ({executable}): {e}") from None
        finally:
            os.close(write_fd)
        self._ready_fd = read_fd

    def wait_ready(self, timeout_s: float) -> None:
        """Raises LmrTimeoutError or LmrIOError (with the daemon's reason) when it is not
        ready in time; the daemon is then stopped."""
        try:
            line = self._read_line(self._ready_fd, timeout_s)
        finally:
            os.close(self._ready_fd)
            self._ready_fd = -1
        if not line.startswith("ready "):
            self._kill()
            detail = line[len("error: "):] if line.startswith("error: ") else (_tail(self.log_path) or "no output")
            if not line:
                raise LmrTimeoutError(f"lmr-oobd was not ready within {timeout_s:.0f} s: {detail}")
            raise LmrIOError(f"lmr-oobd failed to start: {detail}")
        parts = line.split()
        self.report_stem, self.key_prefix = parts[1], parts[2] if len(parts) > 2 else ""
        self._thread = threading.Thread(target=self._supervise, name="lmr-oobd-supervisor", daemon=True)
        self._thread.start()

    def _read_line(self, fd: int, timeout_s: float) -> str:
        data = b""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return ""
            chunk = os.read(fd, 4096)
            if not chunk:  # the daemon exited before it was ready
                return data.decode(errors="replace").strip() or "error: " + (_tail(self.log_path) or "exited")
            data += chunk
        return data.split(b"\n", 1)[0].decode(errors="replace").strip()

    def _supervise(self) -> None:
        code = self.proc.wait()
        if not self._stopping:
            self._on_exit(code, _tail(self.log_path))

    def _kill(self) -> None:
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        if self._ready_fd >= 0:  # stopped before it was ready
            os.close(self._ready_fd)
            self._ready_fd = -1
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
