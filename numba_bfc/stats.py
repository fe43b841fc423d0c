"""Allocator statistics (TensorFlow's ``AllocatorStats``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["AllocatorStats", "format_bytes"]


def format_bytes(n: int) -> str:
    """Human-readable byte count, as TF's ``HumanReadableNumBytes`` (1024-based)."""
    n = int(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n}B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        n /= 1024.0
        if n < 1024 or unit == "EiB":
            return f"{sign}{n:.2f}{unit}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of an allocator's counters.

    Field meanings follow TensorFlow's ``AllocatorStats``: ``bytes_in_use`` counts
    whole chunks handed out (after rounding), ``bytes_reserved`` is the memory held
    from the backend (TF's pool bytes) and ``fragmentation`` is TF's
    ``GetFragmentation``: ``(free - largest_free) / free`` over the pool's free
    bytes (0.0 when nothing is free).
    """

    num_allocs: int = 0
    bytes_in_use: int = 0
    peak_bytes_in_use: int = 0
    largest_alloc_size: int = 0
    bytes_limit: int = 0
    bytes_reserved: int = 0
    peak_bytes_reserved: int = 0
    largest_free_block_bytes: int = 0
    fragmentation: float = 0.0

    def _repr_html_(self) -> str:
        from ._html import table

        rows = [(k, f"{v:.4f}" if isinstance(v, float) else
                 f"{v:,}" + (f" ({format_bytes(v)})" if "bytes" in k or "size" in k
                             or k == "bytes_limit" else ""))
                for k, v in self.to_dict().items()]
        return table(rows, "AllocatorStats")

    def to_dict(self) -> dict:
        """The fields as a plain, JSON-serialisable dict."""
        return asdict(self)

    def debug_string(self) -> str:
        """Multi-line summary in the spirit of TF's ``AllocatorStats::DebugString``."""
        rows = [
            ("Limit", self.bytes_limit),
            ("InUse", self.bytes_in_use),
            ("MaxInUse", self.peak_bytes_in_use),
            ("NumAllocs", self.num_allocs),
            ("MaxAllocSize", self.largest_alloc_size),
            ("Reserved", self.bytes_reserved),
            ("PeakReserved", self.peak_bytes_reserved),
            ("LargestFreeBlock", self.largest_free_block_bytes),
        ]
        lines = [f"{k + ':':<18}{v:>20}" for k, v in rows]
        lines.append(f"{'Fragmentation:':<18}{self.fragmentation:>20.4f}")
        return "\n".join(lines)
