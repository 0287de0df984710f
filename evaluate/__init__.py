"""Checkpoint evaluation: responder accuracy and gain with and without the policy's states."""
