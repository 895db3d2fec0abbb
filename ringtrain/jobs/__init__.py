"""The ringtrain job service: clusters, job specs, scheduling, executors, a REST API and its CLI.

Layout: ``models`` (specs, states, infos), ``store`` (SQLite), ``scheduler``, ``executors``
(local), ``share`` (the job folders), ``service`` (the operations), ``api`` (FastAPI),
``server`` (process management), ``client`` (httpx) and ``cli``. The service never imports torch:
jobs reach training only through ``ringtrain run`` in a subprocess.
"""
