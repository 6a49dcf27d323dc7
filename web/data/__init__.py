"""Data access for the web service: plain functions over a session, returning API models.

Each module serves one area; the JSON API and the console pages call the same
functions, so a page never shows what the API would not.
"""
