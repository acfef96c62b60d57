"""Retrieval: two-tower training support, item catalogues, faiss recall."""
