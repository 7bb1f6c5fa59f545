"""Built-in models (no downloads: random weights, fixed seeds) and the embedded repository."""
