"""Fixtures for the GPU tests (``python -m pytest -m cuda tests/gpu benchmarks/gpu``).

Without an NVIDIA GPU, its driver and numba-cuda, every test here is skipped.
"""

import pytest
from gpu_support import COMBINATIONS, numba_bfc_context


@pytest.fixture(params=COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def bfc_context(request):
    """Each test runs under every policy and backend combination."""
    policy, backend = request.param
    with numba_bfc_context(policy=policy, backend=backend) as ctx:
        yield ctx
