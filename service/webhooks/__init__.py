"""Webhook delivery: the outbox dispatcher (signing lives in :mod:`service.core.security`)."""
