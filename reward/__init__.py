"""Reward: scoring, gates, the counterfactual-gain TRL reward function."""
