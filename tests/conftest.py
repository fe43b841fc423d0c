import os

import pytest
from hypothesis import HealthCheck, settings

from numba_bfc import BFCAllocator, CachingAllocator
from numba_bfc.testing import ReferenceBFCAllocator, ReferenceCachingAllocator

settings.register_profile(
    "default", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

IMPLEMENTATIONS = [BFCAllocator, ReferenceBFCAllocator]


@pytest.fixture(params=IMPLEMENTATIONS, ids=["numba", "reference"])
def impl(request):
    """Each BFC test runs on the Numba allocator and on the reference oracle."""
    return request.param


@pytest.fixture(params=[CachingAllocator, ReferenceCachingAllocator], ids=["numba", "reference"])
def caching_impl(request):
    """Each caching-policy test runs on the Numba allocator and on the reference oracle."""
    return request.param


@pytest.fixture(autouse=True)
def _no_env_conf(monkeypatch):
    monkeypatch.delenv("NUMBA_BFC_CONF", raising=False)
