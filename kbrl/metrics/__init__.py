"""Metric projections of the event store and their writers (TensorBoard scalars: `kbrl.metrics.tensorboard`)."""
