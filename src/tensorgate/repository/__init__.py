"""Triton-layout model repositories: config.pbtxt, version directories, model artifacts."""
