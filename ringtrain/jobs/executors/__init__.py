"""Executors run a job's attempt on its nodes: the Executor protocol (``base``), the
ClusterBackend protocol and the local backend (``backend``), the routing of attempts to their
backend's executor (``routing``), the ``local`` executor and its job runner, and the ``ray``
backend. Nothing is imported here so that the per-job runner process starts quickly."""
