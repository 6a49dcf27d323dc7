"""Governance loop: task admission, environment versions, promotion gates and rollback.

This package's pure core (``gates``, ``admission``, ``contract_diff``, ``durations``)
imports only the standard library and pydantic, so Temporal workflows and update
validators can call it without leaving the sandbox's deterministic world.
"""
