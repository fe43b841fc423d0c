"""Allocator options: constructor arguments, then ``NUMBA_BFC_CONF``, then defaults."""

from __future__ import annotations

from dataclasses import dataclass

from .._config import (
    conf_from_env,
    parse_bool,
    parse_float,
    parse_size,
    parse_str,
    register_conf_keys,
)

# Keys accepted in NUMBA_BFC_CONF: the constructor's option names.
BFC_CONF_KEYS = {
    "memory_limit": parse_size,
    "allow_growth": parse_bool,
    "garbage_collection": parse_bool,
    "fragmentation_fraction": parse_float,
    "name": parse_str,
}
# Read by the Numba plugin (numba_bfc.integrations): policy, backend, stream safety.
PLUGIN_CONF_KEYS = ("policy", "backend", "stream_safety")


@dataclass(frozen=True)
class BFCOptions:
    memory_limit: int
    allow_growth: bool
    garbage_collection: bool
    fragmentation_fraction: float
    name: str


def _merge(keys, explicit) -> dict:
    """``NUMBA_BFC_CONF``'s values for ``keys``, overridden by explicit ones (not None)."""
    merged = dict(conf_from_env(keys))
    merged.update({k: v for k, v in explicit.items() if v is not None})
    return merged


def _required_limit(merged, backend) -> int:
    """``memory_limit`` from ``merged``, else the backend's ``total_memory()``."""
    limit = merged.get("memory_limit")
    if limit is None:
        limit = backend.total_memory()
        if limit is None:
            raise ValueError(
                "memory_limit is required: the backend has no capacity to default to")
    limit = parse_size(limit, name="memory_limit")
    if limit <= 0 or limit >= 1 << 62:
        raise ValueError(f"memory_limit must be in (0, 2**62), got {limit}")
    return limit


def resolve_bfc_options(backend, **explicit) -> BFCOptions:
    """Merge explicit arguments (not None) over the environment over defaults.

    ``memory_limit`` defaults to the backend's ``total_memory()``.
    """
    merged = _merge(BFC_CONF_KEYS, explicit)
    limit = _required_limit(merged, backend)
    frac = parse_float(merged.get("fragmentation_fraction", 0.0), name="fragmentation_fraction")
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"fragmentation_fraction must be in [0, 1], got {frac}")
    return BFCOptions(
        memory_limit=limit,
        allow_growth=parse_bool(merged.get("allow_growth", True), name="allow_growth"),
        garbage_collection=parse_bool(
            merged.get("garbage_collection", False), name="garbage_collection"
        ),
        fragmentation_fraction=frac,
        name=parse_str(merged.get("name", "bfc"), name="name"),
    )


# ---------------------------------------------------------------------- compact policy
COMPACT_CONF_KEYS = {
    "memory_limit": parse_size,
    "page_size": parse_size,
    "release_threshold": parse_size,
    "small_size": parse_size,
    "name": parse_str,
}
DEFAULT_SMALL_SIZE = 1 << 20  # requests below go to the small space, when there is one
DEFAULT_PAGE_SIZE = 2 << 20  # CUDA's usual virtual-memory granularity


@dataclass(frozen=True)
class CompactOptions:
    memory_limit: int
    page_size: int
    release_threshold: int
    small_size: int
    name: str


def resolve_compact_options(backend, **explicit) -> CompactOptions:
    """Merge explicit arguments (not None) over ``NUMBA_BFC_CONF`` over defaults.

    ``page_size`` defaults to the backend's ``granularity`` when it has one of
    at least 256 bytes, else 2 MiB; ``release_threshold`` to 0 (give free
    tails back only on ``empty_cache()`` and before an out-of-memory error).
    """
    merged = _merge(COMPACT_CONF_KEYS, explicit)
    limit = _required_limit(merged, backend)
    page = merged.get("page_size")
    if page is None:
        granularity = int(getattr(backend, "granularity", 0) or 0)
        page = granularity if granularity >= 256 else DEFAULT_PAGE_SIZE
    page = parse_size(page, name="page_size")
    if page < 256 or page & (page - 1):
        raise ValueError(f"page_size must be a power of two of at least 256 bytes, got {page}")
    threshold = merged.get("release_threshold")
    threshold = 0 if threshold is None else parse_size(threshold, name="release_threshold")
    if threshold < 0:
        raise ValueError(f"release_threshold must be >= 0 (0: never), got {threshold}")
    small = parse_size(merged.get("small_size", DEFAULT_SMALL_SIZE), name="small_size")
    return CompactOptions(memory_limit=limit, page_size=page, release_threshold=threshold,
                          small_size=small,
                          name=parse_str(merged.get("name", "compact"), name="name"))


# ---------------------------------------------------------------------- caching policy
_MIB = 1 << 20
_MAX_SPLIT_MIN_MB = 20  # PyTorch: max_split_size_mb must exceed kLargeBuffer (20 MiB)
UNLIMITED = (1 << 63) - 1  # PyTorch's SIZE_MAX, as an int64 table value


def _parse_mb(value, *, name):
    """A size for PyTorch's ``*_mb`` keys: a bare number means MiB."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return parse_size(value, name=name) * _MIB
    return parse_size(value, name=name)


def _is_pow2_or_zero(v: int) -> bool:
    return v >= 0 and v & (v - 1) == 0


def parse_roundup_divisions(value, *, name: str = "roundup_power2_divisions") -> tuple:
    """PyTorch's ``roundup_power2_divisions``: one entry per power-of-two interval
    from 1 MiB to 64 GiB (16 in all).

    Accepts an int (every interval), a dict ``{interval_mb: divisions, ">": d}``
    or PyTorch's string forms ``"4"`` and ``"[256:1,512:2,>:8]"``. Interval keys
    are powers of two in MiB; divisions are powers of two or 0 (off).
    """
    table = [0] * 16
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            if not text.endswith("]"):
                raise ValueError(f"{name}: missing ']' in {value!r}")
            pairs = {}
            for item in filter(None, (t.strip() for t in text[1:-1].split(","))):
                key, sep, div = item.partition(":")
                if not sep:
                    raise ValueError(f"{name}: entry {item!r} is not interval_mb:divisions")
                try:
                    pairs[key.strip() if key.strip() == ">" else int(key)] = int(div)
                except ValueError:
                    raise ValueError(f"{name}: entry {item!r} is not interval_mb:divisions") \
                        from None
            value = pairs
        else:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{name}: expected an int or [interval:div,...], got {value!r}") \
                    from None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a mapping, not bool")
    if isinstance(value, int):
        if not _is_pow2_or_zero(value):
            raise ValueError(f"{name}: divisions must be a power of two or 0, got {value}")
        return tuple([value] * 16)
    if not hasattr(value, "items"):
        raise TypeError(f"{name} must be an int, a mapping or a string, not {type(value).__name__}")
    last = 0
    # PyTorch's parser: entries in order; the first fills every interval below
    # it, ">" fills every interval from the last one given.
    for key, div in value.items():
        if isinstance(div, bool) or not isinstance(div, int) or not _is_pow2_or_zero(div):
            raise ValueError(f"{name}: divisions must be a power of two or 0, got {div!r}")
        if key == ">":
            table[last:] = [div] * (16 - last)
            continue
        if isinstance(key, bool) or not isinstance(key, int) or key <= 0 or key & (key - 1):
            raise ValueError(f"{name}: interval {key!r} must be a power of two (MiB)")
        index = min(key.bit_length() - 1, 15)
        if last == 0:
            table[:index] = [div] * index
        table[index] = div
        last = index
    return tuple(table)


CACHING_CONF_KEYS = {
    "memory_limit": parse_size,
    "memory_fraction": parse_float,
    "per_process_memory_fraction": parse_float,
    "max_split_size": parse_size,
    "max_split_size_mb": _parse_mb,
    "max_non_split_rounding_mb": _parse_mb,
    "roundup_power2_divisions": parse_roundup_divisions,
    "garbage_collection_threshold": parse_float,
    "expandable_segments": parse_bool,
    "name": parse_str,
}
register_conf_keys(BFC_CONF_KEYS)
register_conf_keys(CACHING_CONF_KEYS)
register_conf_keys(COMPACT_CONF_KEYS)
register_conf_keys(PLUGIN_CONF_KEYS)


@dataclass(frozen=True)
class CachingOptions:
    memory_limit: int | None  # None: only the backend limits (PyTorch without a fraction)
    max_split_size: int  # UNLIMITED when not set
    max_non_split_rounding: int
    roundup_power2_divisions: tuple
    garbage_collection_threshold: float
    expandable_segments: bool
    name: str


def resolve_caching_options(backend, **explicit) -> CachingOptions:
    """Merge explicit arguments (not None) over ``NUMBA_BFC_CONF`` over defaults."""
    env = conf_from_env(CACHING_CONF_KEYS)
    # PyTorch spellings in the environment map onto the constructor's names.
    if "max_split_size_mb" in env:
        env.setdefault("max_split_size", env.pop("max_split_size_mb"))
    if "per_process_memory_fraction" in env:
        env.setdefault("memory_fraction", env.pop("per_process_memory_fraction"))
    if "max_non_split_rounding_mb" in env:
        env["max_non_split_rounding"] = env.pop("max_non_split_rounding_mb")
    merged = dict(env)
    merged.update({k: v for k, v in explicit.items() if v is not None})

    # A limit and a fraction say the same thing: take the one given at the
    # highest level (arguments over environment); both at one level is an error.
    for level in (explicit, env):
        given = [k for k in ("memory_limit", "memory_fraction") if level.get(k) is not None]
        if len(given) == 2:
            raise ValueError("give memory_limit or memory_fraction, not both")
        if given:
            break
    limit = level.get("memory_limit") if given else None
    if given == ["memory_fraction"]:
        fraction = parse_float(level["memory_fraction"], name="memory_fraction")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {fraction}")
        total = backend.total_memory()
        if total is None:
            raise ValueError("memory_fraction needs a backend with a known total memory")
        limit = int(fraction * total)
    if limit is not None:
        limit = parse_size(limit, name="memory_limit")
        if limit <= 0 or limit >= 1 << 62:
            raise ValueError(f"memory_limit must be in (0, 2**62), got {limit}")

    max_split = merged.get("max_split_size")
    if max_split is None:
        max_split = UNLIMITED
    else:
        max_split = parse_size(max_split, name="max_split_size")
        if max_split <= _MAX_SPLIT_MIN_MB * _MIB:
            raise ValueError(
                f"max_split_size must be more than {_MAX_SPLIT_MIN_MB} MiB (PyTorch's "
                f"kLargeBuffer), got {max_split} bytes")
    rounding = parse_size(merged.get("max_non_split_rounding", 20 * _MIB),
                          name="max_non_split_rounding")
    if rounding < 20 * _MIB:
        raise ValueError(f"max_non_split_rounding must be at least 20 MiB, got {rounding}")
    divisions = merged.get("roundup_power2_divisions", 0)
    if not isinstance(divisions, tuple):
        divisions = parse_roundup_divisions(divisions)
    threshold = parse_float(merged.get("garbage_collection_threshold", 0.0),
                            name="garbage_collection_threshold")
    if not 0.0 <= threshold < 1.0:
        raise ValueError(
            f"garbage_collection_threshold must be in [0, 1) (0 = off), got {threshold}")
    if threshold > 0.0 and limit is None:
        raise ValueError(
            "garbage_collection_threshold needs memory_limit or memory_fraction: PyTorch's "
            "collector only runs against a per-process limit")
    expandable = parse_bool(merged.get("expandable_segments", False),
                            name="expandable_segments")
    if expandable and not getattr(backend, "supports_remap", False):
        raise ValueError(
            "expandable_segments needs a backend that maps memory at chosen addresses "
            "(supports_remap): VirtualSubAllocator(contiguous=True), "
            "HostSubAllocator(capacity, contiguous=True) or CudaVirtualSubAllocator")
    return CachingOptions(
        memory_limit=limit,
        max_split_size=max_split,
        max_non_split_rounding=rounding,
        roundup_power2_divisions=divisions,
        garbage_collection_threshold=threshold,
        expandable_segments=expandable,
        name=parse_str(merged.get("name", "caching"), name="name"),
    )
