"""The ``local`` backend: a cluster's nodes are process slots on the service's host. Its backend
(with its plug-in) and executor, the job runner process that runs each attempt, its records, and
how an attempt's processes are found and killed (``procs``, ``cgroups``). Nothing is imported
here so that the job runner process starts quickly."""
