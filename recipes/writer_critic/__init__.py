"""A writer and a critic written for any OpenAI-compatible server (``program.py``), trained
unmodified through Tandem's gateway (docs/gateway.md)."""
