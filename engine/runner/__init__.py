"""Turns a SchedulerOutput into tensors, runs the target and draft models, samples and verifies."""
