"""Child processes that end with their parent, however the parent ends (SPEC §8: "child processes exit with
their parent"), including SIGKILL, which runs none of the parent's clean-up.

Two mechanisms:

- :func:`watch_parent`, for the Python children (the sink process, the quality
  scorer): a daemon thread in the child checks every ``poll_s`` whether the
  process that started it is still its parent. Once the parent is gone (the
  child was re-parented to init or a subreaper), the child gets ``grace_s``
  to end on its own (the sink process ends when its socket closes), then
  ends with ``os._exit(ORPHANED_EXIT_CODE)``. It works whichever thread of
  the parent started the child, unlike the kernel's parent-death signal.
- :func:`death_signal_preexec`, for a child that runs no Python (the Tansu
  broker): ``prctl(PR_SET_PDEATHSIG, sig)`` between fork and exec
  (``preexec_fn``; Linux only, prctl(2); kept across ``execve``). The kernel sends ``sig`` when the
  *thread* that forked the child ends, so it may only be used for children
  started from a thread that lives as long as the process (the main thread);
  it returns None elsewhere.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

#: Exit status of a child that ended because its parent was gone (EX_SOFTWARE would hide it among bugs).
ORPHANED_EXIT_CODE = 75
#: How often the watch thread looks at the parent (s): the delay between the parent's death and the child's.
POLL_S = 0.25
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def watch_parent(parent_pid: int, *, grace_s: float = 0.0, poll_s: float = POLL_S,
                 name: str = "child process") -> threading.Thread:
    """Start a daemon thread that ends this process once ``parent_pid`` is no longer its parent.

    ``parent_pid``: the parent's pid as the parent saw it (``os.getpid()`` there, passed to the child), not
    this process's ``os.getppid()`` at start, which is already init's if the parent died first.
    ``grace_s`` >= 0: time left to the process to end on its own after the parent is gone (for a clean
    close); then ``os._exit(ORPHANED_EXIT_CODE)``. ``poll_s`` > 0. ``name``: for the log line. Raises
    ``ValueError`` for a negative ``grace_s`` or a ``poll_s`` <= 0. Returns the started thread.
    """
    if grace_s < 0 or poll_s <= 0:
        raise ValueError(f"grace_s must be >= 0 and poll_s > 0, got {grace_s!r}, {poll_s!r}")

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        log.warning("%s %d: parent %d is gone; exiting%s", name, os.getpid(), parent_pid,
                    f" within {grace_s:g} s" if grace_s else "")
        if grace_s:
            time.sleep(grace_s)
        _flush_std_streams()
        os._exit(ORPHANED_EXIT_CODE)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def death_signal_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``subprocess.Popen`` ``preexec_fn`` that gives the child ``sig`` when this process dies, or None.

    None when not on Linux or not called from the main thread (the kernel would signal the child when the
    calling thread ends, not the process; see the module doc): the caller then stops the child itself only.
    The returned function also ends the child at once if this process died between fork and prctl.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _prctl()  # resolved here: the forked child should call, not load, libc
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(ORPHANED_EXIT_CODE)

    return preexec


def wait_ended(procs: Iterable[Any], timeout_s: float) -> list[Any]:
    """Wait up to ``timeout_s`` (>= 0) for ``procs`` (``psutil.Process``) to end; returns those still running.

    For processes that may no longer be the caller's children (orphans re-parented to init): one that has
    exited but not been reaped yet (a zombie; init reaps it in its own time) counts as ended. psutil tells
    a reused pid apart from the original process.
    """
    import psutil

    deadline = time.monotonic() + timeout_s
    alive = list(procs)
    while True:
        _gone, alive = psutil.wait_procs(alive, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
        alive = [p for p in alive if not _zombie(p)]
        if not alive or time.monotonic() >= deadline:
            return alive


def _zombie(proc: Any) -> bool:
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _prctl() -> Callable[..., int]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.prctl
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing more to save
            pass
