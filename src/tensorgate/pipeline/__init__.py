"""The inference pipeline: scheduler (loop side) → executor thread → post-processing pool."""
