"""Placeholder, replaced by the family module."""

ENTRIES = ()
