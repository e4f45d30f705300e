"""Re-ranking as a service (server.py): an HTTP server over a trained re-ranker.

engine.py is the one adapter onto the re-ranking library (load, parse, warm, rank); batching.py
the bounded queue and its decode worker; metrics.py the Prometheus metrics; server.py the
FastAPI application, uvicorn and the `--config=serve.py` entry point.
"""
