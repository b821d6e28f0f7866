"""Tandem's retriever service: FastAPI + faiss, ``create_app(settings)`` (planned, issue 8)."""
