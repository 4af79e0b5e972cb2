"""Metric tables of a run, computed from the results store alone."""
