"""The REST API (FastAPI) and the request/response schemas it shares with the client."""
