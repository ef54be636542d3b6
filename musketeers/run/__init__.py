"""One run: its parts built from a config, the training loop, evaluation, the run folder,
checkpoints and logs."""
