"""Experiments that run the whole method (data → responder → policy → evaluation) end to end."""
