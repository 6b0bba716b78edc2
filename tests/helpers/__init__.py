"""Shared test helpers: model builders, oracles' checks, statistics, fixtures' makers."""
