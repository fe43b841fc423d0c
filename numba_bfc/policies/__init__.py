"""Allocation policies: which free chunk serves a request and how it is cut.

Each policy is a few ``@njit`` kernels built on ``numba_bfc.kernels``.
"""
