"""The RL trainer: config, batching, updates, checkpoints, logging and plots."""
