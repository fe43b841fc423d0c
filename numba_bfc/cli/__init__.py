"""The ``numba-bfc`` commands: ``replay`` (``numba_bfc.cli.replay``) and ``plan``
(``numba_bfc.cli.plan``), on top of every other part; ``common`` holds what
they share (argument types, the one ``error:`` line)."""
