"""`edgeinfer serve`: an OpenAI-compatible HTTP server on a Unix socket."""
