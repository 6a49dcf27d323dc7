"""The learning loop's activities: the imperative shell around the pure training core.

- ``messages``: activity names and their dataclasses (no torch, no database), shared with
  ``learning_loop.workflows`` so the workflow side never imports torch.
- ``run_state``: light database work on the ``learning`` queue (validate a run, record its
  status, carry out a person's pause/resume/cancel, propose a checkpoint to governance).
- ``training``: one iteration's update as plain functions (torch), no Temporal.
- ``update``: the update and base-registration activities on ``learning-gpu`` (heartbeats,
  idempotency per run and iteration, the database writes).

This package ``__init__`` imports nothing so that importing ``messages`` stays light.
"""
