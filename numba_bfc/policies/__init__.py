"""Allocation policies: which free chunk serves a request and how it is cut.

Each policy is a few ``@njit`` kernels built on ``numba_bfc.kernels``: helpers
over the tables, inlined into the ``*_op`` kernels the façade calls with the
state alone; ``batch`` runs a whole array of operations with one policy.
"""
