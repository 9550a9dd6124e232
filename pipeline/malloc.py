"""glibc malloc settings of the long-running processes (worker, sink process).

Kept free of heavy imports: the sink process calls it before it imports ClickHouse.
"""

from __future__ import annotations

import ctypes
import logging
import platform

#: glibc malloc of the worker and sink processes (``mallopt``, glibc manual "Malloc Tunable Parameters"):
#: blocks up to ``M_MMAP_THRESHOLD`` bytes come from the heap instead of a fresh ``mmap`` each, and the heap keeps
#: up to ``M_TRIM_THRESHOLD`` bytes of free memory at its top instead of returning it to the kernel at once.
#: Every 500-event envelope (~360 KB), decoded batch and row payload is one such block: with glibc's defaults
#: each was mapped, faulted in page by page and unmapped again (216 vs 16 µs CPU per 360 KB message allocated
#: and freed, 0.4 µs per event). 32 MiB is glibc's own ceiling for its adaptive threshold on 64-bit.
MALLOC_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
MALLOC_TRIM_THRESHOLD_BYTES = 16 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>


log = logging.getLogger(__name__)


def tune_malloc() -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` / ``M_TRIM_THRESHOLD`` for a worker or sink process (call once, early).

    Values: :data:`MALLOC_MMAP_THRESHOLD_BYTES`, :data:`MALLOC_TRIM_THRESHOLD_BYTES` (why: their comment).
    Returns True when set; False, with a DEBUG log line, where the C library is not glibc (e.g. musl,
    macOS): those allocators keep their own behaviour and the worker runs as before, only slower per event.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.debug("malloc tuning skipped: C library is not glibc (%s)", platform.libc_ver()[0] or platform.system())
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
                    and libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES))
    except (OSError, AttributeError) as exc:
        log.debug("malloc tuning skipped: %s", exc)
        return False
