"""GRPO wiring: dataset to prompts, GRPOConfig from YAML, the training entry point."""
