"""Training: the run and its loop, checkpoints, the optimiser, validation, stopping, prefetching."""
