"""Serving the trained policy: vLLM for the policy (``serve policy``), the reasoning-state API (``serve api``), and
its client."""
