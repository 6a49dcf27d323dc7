"""triloop's shared kernel: configuration, database, tables, policy client, audit, artifacts.

A loop package imports from here; nothing here imports a loop.
"""

__version__ = "0.1.0"
