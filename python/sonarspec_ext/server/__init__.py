"""`sonarspec serve`: an OpenAI-compatible HTTP server on the speculative engine."""
