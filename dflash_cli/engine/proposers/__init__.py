"""Drafters behind the Proposer interface (engine/speculative.py)."""
