"""Estimators: the surrogate factory, the catalog and one module per family."""
