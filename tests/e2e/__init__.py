"""End-to-end tests: one package, so that its modules share one served instance (package scope)."""
