"""Tools: never imported by the worker."""
