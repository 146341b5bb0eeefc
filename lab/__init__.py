"""Experiments: A/B studies run through the collector's gate and timing (lab/ab.py)."""
