"""ringtrain.web: what the job service and the model server share about being an HTTP server:
who may reach it (:mod:`.exposure`), a bound on request bodies (:mod:`.body_limit`), the timing
of each request for ``/metrics`` (:mod:`.request_timing`) and offline API docs. Import the module
you need; this package imports nothing, and nothing here imports torch."""
