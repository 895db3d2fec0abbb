"""Executors run a job's attempts on its nodes, one backend each, as plug-ins.

Shared by every backend: the Executor protocol (``base``), the ClusterBackend protocol
(``backend``), the registry that finds the backends by name and builds them (``registry``), the
routing of attempts to their backend's executor (``routing``) and the one launch path of a node's
ranks (``node_launch``). Each backend is a folder: ``local/`` (process slots on the service's
host, a job runner process per attempt) and ``ray/``. Nothing is imported here so that the job
runner process starts quickly."""
