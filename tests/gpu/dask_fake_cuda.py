"""Dask worker preload: load the fake CUDA driver before anything imports numba.cuda.

``LocalCluster(preload=[path of this file])`` runs ``dask_setup`` in each new
worker process as it starts, before any plugin. Dask runs a copy from the
worker's scratch space, so the folder of ``fake_cuda.py`` comes from
``NUMBA_BFC_FAKE_CUDA_DIR``.
"""

import os
import sys


def dask_setup(worker):
    sys.path.insert(0, os.environ["NUMBA_BFC_FAKE_CUDA_DIR"])
    import fake_cuda

    fake_cuda.preload()
