"""Model files: the catalog (catalog.toml), --model resolution, GGUF metadata; installed as edgeinfer.models."""
