"""The method: the adapter (Eq. 6-16), the LoRA policy, GRPO (Eq. 4), the rollout, routing
metrics (Eq. 15), and the registry of methods and controls."""
