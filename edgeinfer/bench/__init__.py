"""Benchmarks: the engine measured side by side with a raw loop over the same bindings."""
