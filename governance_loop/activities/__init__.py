"""Governance activities: the imperative shell around the pure gates.

``messages`` holds the activity names and dataclasses (no database imports, so the
workflows can import it); ``promotion``, ``rollback`` and ``admission`` hold the
activity classes, which receive their engine and authorizer from ``worker.py``.
"""
