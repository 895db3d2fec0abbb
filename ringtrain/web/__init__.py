"""ringtrain.web: what the job service and the model server share about being an HTTP server:
who may reach it (:mod:`.exposure`) and a bound on request bodies (:mod:`.body_limit`).
Import the module you need; this package imports nothing, and nothing here imports torch."""
