"""ringtrain.serve: a trained model behind HTTP (``ringtrain serve MODEL``).

``config`` holds :class:`ServeConfig`; ``predictor`` turns tensors and image files into model
outputs; ``batching`` groups concurrent requests into batches on a worker thread; ``metrics`` the
Prometheus series; ``app`` the FastAPI routes (KServe Open Inference Protocol v2, an image route);
``server`` runs it with uvicorn; ``cli`` is the command. Import the module you need; this package
imports nothing.
"""
