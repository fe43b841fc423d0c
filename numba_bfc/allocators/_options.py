"""BFC options: constructor arguments, then ``NUMBA_BFC_CONF``, then defaults."""

from __future__ import annotations

from dataclasses import dataclass

from .._config import conf_from_env, parse_bool, parse_float, parse_size, parse_str

# Keys accepted in NUMBA_BFC_CONF: the constructor's option names.
BFC_CONF_KEYS = {
    "memory_limit": parse_size,
    "allow_growth": parse_bool,
    "garbage_collection": parse_bool,
    "fragmentation_fraction": parse_float,
    "name": parse_str,
}


@dataclass(frozen=True)
class BFCOptions:
    memory_limit: int
    allow_growth: bool
    garbage_collection: bool
    fragmentation_fraction: float
    name: str


def resolve_bfc_options(backend, **explicit) -> BFCOptions:
    """Merge explicit arguments (not None) over the environment over defaults.

    ``memory_limit`` defaults to the backend's ``total_memory()``.
    """
    env = conf_from_env(BFC_CONF_KEYS)
    merged = dict(env)
    merged.update({k: v for k, v in explicit.items() if v is not None})
    limit = merged.get("memory_limit")
    if limit is None:
        limit = backend.total_memory()
        if limit is None:
            raise ValueError(
                "memory_limit is required: the backend has no capacity to default to"
            )
    limit = parse_size(limit, name="memory_limit")
    if limit <= 0 or limit >= 1 << 62:
        raise ValueError(f"memory_limit must be in (0, 2**62), got {limit}")
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
