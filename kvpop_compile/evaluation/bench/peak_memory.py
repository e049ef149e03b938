"""Peak memory of a region of code, on the CPU or a CUDA device.

On the CPU it is the process's peak resident set (``VmHWM``), reset on entry through
``/proc/self/clear_refs``: memory a path allocates while it runs, whatever allocates it (C++
kernels included). On a CUDA device it is the caching allocator's peak of allocated bytes.
Either way :meth:`growth` is the peak above what was resident when the region began, so the
weights and libraries every path shares are not counted.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import torch


def _status_kib(field_name: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field_name}:\s+(\d+) kB", text, re.MULTILINE).group(1))


def _release_free_heap() -> None:
    # Freed blocks below glibc's mmap threshold stay resident in the heap; trimming returns
    # them, so the resident size after a measurement counts live memory only.
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


def _fix_mmap_threshold() -> None:
    # glibc raises its mmap threshold each time a large block is freed, after which large
    # tensors come from the heap and their pages may stay resident; how much depends on the
    # order of earlier allocations. A fixed threshold maps every tensor of 1 MiB or more on its
    # own and returns it when freed, so a peak reflects the memory a path needs, not history.
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def peak_memory_supported() -> bool:
    """Whether this process can reset and read its peak resident set (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _status_kib("VmHWM")
    except (OSError, AttributeError):
        return False
    return True


class PeakMemory:
    """Peak resident memory of a region, in bytes.

    ``with PeakMemory() as peak: ...`` resets the peak on entry. :meth:`growth` is the peak above
    the resident size at entry; :meth:`settle`, called once the region's objects are freed, the
    peak above what stays resident. Both are ``None`` where the peak cannot be read (not Linux).
    """

    def __init__(self):
        self.supported = peak_memory_supported()
        if self.supported:
            _fix_mmap_threshold()
        self.start_kib: int | None = None
        self.peak_kib: int | None = None
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.supported:
            _release_free_heap()
            self.start_kib = _status_kib("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")
        return self

    def __exit__(self, *exc) -> None:
        if self.supported:
            self.peak_kib = _status_kib("VmHWM")

    def growth(self) -> int | None:
        """The peak above the resident size when the region began."""
        if self.peak_kib is None:
            return None
        return max(0, self.peak_kib - self.start_kib) * 1024

    def settle(self) -> int | None:
        """Record the peak above the resident size now (call after freeing the region's data)."""
        if self.peak_kib is None:
            return None
        _release_free_heap()
        self.bytes = max(0, self.peak_kib - _status_kib("VmRSS")) * 1024
        return self.bytes


class CudaPeakMemory:
    """Peak allocated memory of a region on a CUDA device, in bytes (the caching allocator's
    count: tensors, not the allocator's reserve), with :class:`PeakMemory`'s ``growth``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start: int | None = None
        self.peak: int | None = None

    def __enter__(self) -> CudaPeakMemory:
        torch.cuda.synchronize(self.device)
        self.start = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device)

    def growth(self) -> int | None:
        """The peak above the bytes allocated when the region began."""
        if self.peak is None:
            return None
        return max(0, self.peak - self.start)


def peak_memory(device: torch.device) -> PeakMemory | CudaPeakMemory:
    """A region's peak-memory meter for ``device``: CUDA's allocator, else the resident set."""
    return CudaPeakMemory(device) if device.type == "cuda" else PeakMemory()
