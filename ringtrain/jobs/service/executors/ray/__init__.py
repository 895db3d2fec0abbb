"""The ``ray`` cluster backend: Ray clusters as job service clusters (the ``ray`` extra)."""
