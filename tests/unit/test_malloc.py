"""glibc malloc settings of the worker and sink processes (pipeline.malloc)."""

import platform
import subprocess
import sys
import textwrap

import pytest

from pipeline import malloc

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Where one block of the given size lands: in a mapping of its own, or in the heap (the "[heap]" range of
# /proc/self/maps).
_PROBE = textwrap.dedent("""
    import ctypes, sys
    from pipeline.malloc import tune_malloc
    if sys.argv[1] == "tuned":
        assert tune_malloc()
    elif sys.argv[1] == "sink":
        from pipeline.malloc import SINK_MMAP_THRESHOLD_BYTES
        assert tune_malloc(SINK_MMAP_THRESHOLD_BYTES)
    block = bytearray(int(sys.argv[2]))
    address = ctypes.addressof(ctypes.c_char.from_buffer(block))
    with open("/proc/self/maps") as fh:
        heap = [line.split()[0].split("-") for line in fh if line.rstrip().endswith("[heap]")]
    print(any(int(lo, 16) <= address < int(hi, 16) for lo, hi in heap))
""")


def _in_heap(mode: str, size: int) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(size)], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.skipif(not GLIBC, reason="mallopt thresholds are glibc's")
def test_tuned_process_takes_a_large_block_from_the_heap_not_a_fresh_mapping():
    assert _in_heap("default", 8 << 20) is False  # glibc's default (128 KiB): an 8 MiB block is mapped on its own
    assert _in_heap("tuned", 8 << 20) is True


@pytest.mark.skipif(not GLIBC, reason="mallopt thresholds are glibc's")
def test_sink_process_keeps_payloads_in_the_heap_and_maps_insert_bodies():
    assert _in_heap("sink", 300 << 10) is True  # a payload of a few hundred KB
    assert _in_heap("sink", 8 << 20) is False  # an insert body: mapped, given back once written


@pytest.mark.parametrize("bad", [0, -1, (32 << 20) + 1])
def test_a_threshold_glibc_would_refuse_is_an_error(bad):
    with pytest.raises(ValueError, match="mmap threshold"):
        malloc.tune_malloc(bad)


def test_other_c_libraries_are_left_alone(monkeypatch, caplog):
    monkeypatch.setattr(malloc.platform, "libc_ver", lambda: ("", ""))
    with caplog.at_level("DEBUG", logger="pipeline.malloc"):
        assert malloc.tune_malloc() is False
    assert "not glibc" in caplog.text

