"""The verifier: re-judges the episodes the gates count, as a role the loops cannot be.

It is not a loop: it starts no workflow and serves none. It polls the database (as
``triloop_verifier``, its own password) for eval, shadow, canary and production episodes
without a verdict, replays each one's stored actions in a fresh environment of the task's
pinned version, from the seed the batch's requester planned, and writes what the contract's
verifier says to ``verdict``. The gates count those verdicts, never the execution loop's own.
"""
