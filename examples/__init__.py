"""Runnable examples (``chorus local`` runs :mod:`examples.parallel_tools`)."""
