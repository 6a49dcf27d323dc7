"""Webhooks: what happened that a person waits for, told to the URLs operators configure.

The source of events is the audit log, read in ``seq`` order: each kind is a row that
only its owning service's database role can write (``events``), so no second event bus
can disagree with the record. For each webhook, ``outbox`` turns new rows into one
delivery per event (an event's key makes a retried activity's second row the same
delivery), ``signing`` signs each attempt's body with the webhook's shared secret
(HMAC-SHA256 over the timestamp and the body), and ``dispatcher`` sends what is due,
retrying with exponential backoff (``delivery``) and recording every attempt in the audit
log. The web service runs the dispatcher (``web.webhook_dispatch``); operators configure
webhooks through ``/api/webhooks``.
"""
