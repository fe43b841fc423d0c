"""``numba_bfc.trace``: the name the trace API is documented under; the code
lives in ``numba_bfc.traces``."""

from .traces import *  # noqa: F403
from .traces import __all__  # noqa: F401
