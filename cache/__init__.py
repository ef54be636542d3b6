"""musketeers.cache — the hidden-state feature cache.

Runs frozen causal LMs once over a list of texts and stores pooled hidden states in Zarr.
Nothing about RL lives here, and nothing here imports from the trainer (``musketeers``).
"""
