"""A tiny environment that lives outside triloop (see ``environment.py``)."""
