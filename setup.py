"""The one compiled module of the package (everything else is in pyproject.toml).

``numba_bfc.allocators._fastpath`` lets the allocators' common calls go from
Python straight into a compiled kernel. It is optional: where it cannot be
built (no C compiler), the package installs without it and the same calls go
through Python methods, which decide the same (``allocators._fastcall``).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("numba_bfc.allocators._fastpath",
                             ["numba_bfc/allocators/_fastpath.c"], optional=True)])
