"""Honest reference candidates for the built-in problems (data read as text, not modules)."""
