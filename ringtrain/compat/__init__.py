"""Compatibility with Horovod's import path.

``shim/`` is not a package: it is a directory that ``ringtrain run --horovod-compat`` puts first on
the workers' ``PYTHONPATH`` (``runner.plan.compat_shim_dir``), so that ``import horovod.torch`` in
an unmodified Horovod script imports ringtrain. It is shipped as package data and never
importable as a top-level ``horovod`` otherwise.
"""
