"""Executors run a job's attempt on its nodes: the Executor protocol (``base``) and the ``local``
executor. Nothing is imported here so that the per-job runner process starts quickly."""
