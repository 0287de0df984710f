"""Serving the trained policy behind vLLM and the reasoning-state API (not built yet: issue 6)."""
