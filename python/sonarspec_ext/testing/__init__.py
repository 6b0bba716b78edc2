"""Test oracles: torch references of the native ops and the pure-Python planner."""
