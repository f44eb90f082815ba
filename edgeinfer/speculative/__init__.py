"""Speculative decoding: drafters (n-gram lookup, a draft model), lossless verification, adaptive control."""
