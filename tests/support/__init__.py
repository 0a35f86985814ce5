"""Helpers shared by test modules (on sys.path through pytest's ``pythonpath = ["tests"]``)."""
