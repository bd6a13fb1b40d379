"""Webhooks: the webhook and delivery concepts (:mod:`~service.webhooks.webhook`, :mod:`~service.webhooks.delivery`:
rows to API shapes, the operations of ``/webhooks`` and ``/deliveries``) and the outbox dispatcher that sends them
(:mod:`~service.webhooks.dispatcher`, :mod:`~service.webhooks.store`, :mod:`~service.webhooks.targets`; signing
lives in :mod:`service.core.security`)."""
