"""Built-in problems of this level (data read as text, not modules)."""
