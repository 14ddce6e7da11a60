"""Internals of the checking kit: the error model, report formatting, the runner, the properties."""
