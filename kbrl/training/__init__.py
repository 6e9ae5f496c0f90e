"""Training: rewards, returns, advantages, datums, the trainer, the updater and its backends."""
