"""pc_cpu.allocator: a freed blob of cells goes back to the OS, even between blocks still in use."""

import platform
import subprocess
import sys
import textwrap

import pytest

from pc_cpu import allocator
from pc_cpu.allocator import map_large_blocks_apart
from pc_cpu.errors import ConfigError

MiB = 1 << 20

# A 24 MiB blob freed first raises glibc's mmap threshold to 24 MiB; then 50 blobs of 4 MiB, each
# followed by a block that stays (as the RAM tier's entries sit between other objects), are freed.
CHILD = textwrap.dedent("""
    import sys
    from pc_cpu.allocator import map_large_blocks_apart

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    if sys.argv[1] == "apart":
        map_large_blocks_apart()
    first = b"x" * (24 << 20)
    del first
    blobs, kept = [], []
    for _ in range(50):
        blobs.append(b"y" * (4 << 20))
        kept.append(b"z" * (100 << 10))
    held = rss()
    del blobs[:]
    print(held, rss())
""")

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the threshold is glibc's")


def _held_and_after_freeing(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True,
                         env={"PC_CPU_MMAP_THRESHOLD": ""}).stdout
    held, after = map(int, out.split())
    return held, after


@needs_glibc
def test_freed_blobs_between_blocks_in_use_go_back_to_the_os():
    held, after = _held_and_after_freeing("apart")
    assert held - after >= 150 * MiB, (held / MiB, after / MiB)


@needs_glibc
def test_without_it_glibc_keeps_the_freed_blobs():
    # The case above is the one that grows a server's RSS: if glibc stopped keeping these, the test
    # above would pass without pc_cpu.allocator and prove nothing.
    held, after = _held_and_after_freeing("default")
    assert held - after < 50 * MiB, (held / MiB, after / MiB)


def test_zero_leaves_malloc_as_it_is(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)  # as in a process where no PromptCache has opened
    monkeypatch.setenv("PC_CPU_MMAP_THRESHOLD", "0")
    assert map_large_blocks_apart() == 0


def test_zero_after_a_threshold_was_set_reports_the_one_in_force(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", 1 << 20)
    monkeypatch.setenv("PC_CPU_MMAP_THRESHOLD", "0")
    assert map_large_blocks_apart() == 1 << 20


def test_a_threshold_that_is_not_a_number_names_the_variable(monkeypatch):
    monkeypatch.setenv("PC_CPU_MMAP_THRESHOLD", "1M")
    with pytest.raises(ConfigError, match=r"\$PC_CPU_MMAP_THRESHOLD='1M' is not a number of bytes"):
        map_large_blocks_apart()
