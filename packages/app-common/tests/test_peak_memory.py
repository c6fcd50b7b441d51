"""The resettable peak-memory measure of app_common.measure (CPU: the resident high-water mark)."""

import sys

import pytest
import torch

from app_common.measure import PeakMemoryMeter, fix_mmap_threshold, peak_memory, reset_peak_memory

MIB = 2**20
#: Slack of the resident counters (updated in batches of pages) and of the interpreter's own pages.
SLACK = 4 * MIB
#: Larger than glibc's largest dynamic mmap threshold (32 MiB): allocated by mmap, unmapped when freed.
BIG = 64 * MIB

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resettable on Linux only")


def test_a_tensor_allocated_in_a_block_raises_its_peak_by_about_its_size():
    with PeakMemoryMeter("cpu") as meter:
        big = torch.ones(BIG // 4)
        del big
    assert abs(meter.added - BIG) < SLACK


def test_a_block_after_a_freed_tensor_does_not_inherit_the_earlier_peak():
    with PeakMemoryMeter("cpu") as first:
        big = torch.ones(BIG // 4)
        del big
    with PeakMemoryMeter("cpu") as second:
        small = torch.ones(MIB // 4)
        del small
    assert first.added > BIG - SLACK
    assert second.peak.bytes < first.peak.bytes - BIG + SLACK


def test_the_cpu_peak_is_the_resident_high_water_mark_since_the_reset():
    baseline = reset_peak_memory(torch.device("cpu"))
    peak = peak_memory(torch.device("cpu"))
    assert peak.kind == "cpu_peak_rss"
    assert baseline <= peak.bytes < baseline + SLACK


def test_reading_the_peak_inside_the_block_is_refused():
    meter = PeakMemoryMeter("cpu")
    with meter, pytest.raises(RuntimeError, match="after the with block"):
        _ = meter.peak


def test_the_mmap_threshold_is_fixed_through_glibc_mallopt():
    assert fix_mmap_threshold()
