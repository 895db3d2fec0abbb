"""The job service: the operations (``job_service``), the scheduler, the share (the job folders),
deployments and their fronts, and in folders the store, the executors (one folder per backend),
the monitor (what the dashboard reads beyond the records) and the API with the server process.
Imports the shared layer and ``files``, never the client; never torch."""
