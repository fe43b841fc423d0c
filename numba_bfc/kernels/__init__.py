"""``@njit`` kernels over the chunk, bin and region tables.

Nothing here knows about backends, Numba CUDA or Python objects: kernels take
NumPy arrays and scalars and return scalars. ``layout`` defines the tables,
``fields`` reads and writes one field of one row, ``tree`` the per-bin ordered
free sets, ``ptrmap`` the pointer -> chunk map and ``chunks`` the split /
merge / coalesce / region machinery every policy shares.
``guard`` gives a kernel called with the state alone views of the tables (and
decides when a call without the façade's lock may proceed), ``jit`` says how
kernels compile, and ``operations`` holds the chunk-level kernels the façade
calls.
"""
