"""The model catalog (catalog.toml), installed as edgeinfer.catalog."""
