"""Interval events derived from point streams (issue 15, the ``INTERVAL`` statement)."""
