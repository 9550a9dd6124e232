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
#: Every 500-event envelope (~140 KB) and every chunk's row payload (up to ~4 MB) is such a block: with glibc's
#: defaults (128 KiB) each was mapped, faulted in page by page and unmapped again (a 140 KB block copied twice
#: and freed: 79 against 6 µs of CPU). Effect in ``channel-health bench``: README "Throughput". 32 MiB is the
#: largest value glibc accepts on 64-bit.
MALLOC_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
MALLOC_TRIM_THRESHOLD_BYTES = 16 * 1024 * 1024
#: The sink process's threshold: the payloads it receives (a chunk's rows, ~100 KB-4 MB) stay in the heap,
#: while the body of an insert (all buffered payloads joined, ~7 MB at 25,000 rows) is mapped and given back
#: as soon as it is written, so the heap does not keep a spare insert body.
SINK_MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>


log = logging.getLogger(__name__)


def tune_malloc(mmap_threshold_bytes: int = MALLOC_MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` / ``M_TRIM_THRESHOLD`` for a worker or sink process (call once, early).

    ``mmap_threshold_bytes``: 1 ≤ value ≤ 32 MiB (the largest glibc accepts; raises ``ValueError``
    outside it); :data:`MALLOC_MMAP_THRESHOLD_BYTES` for the worker, :data:`SINK_MMAP_THRESHOLD_BYTES`
    for the sink process. Trim threshold: :data:`MALLOC_TRIM_THRESHOLD_BYTES` (why: their comments).
    Returns True when set; False, with a DEBUG log line, where the C library is not glibc (e.g. musl,
    macOS): those allocators keep their own behaviour and the worker runs as before, only slower per event.
    """
    if not 1 <= mmap_threshold_bytes <= MALLOC_MMAP_THRESHOLD_BYTES:
        raise ValueError(f"mmap threshold must be 1..{MALLOC_MMAP_THRESHOLD_BYTES} bytes, got {mmap_threshold_bytes!r}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.debug("malloc tuning skipped: C library is not glibc (%s)", platform.libc_ver()[0] or platform.system())
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)
                    and libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES))
    except (OSError, AttributeError) as exc:
        log.debug("malloc tuning skipped: %s", exc)
        return False
