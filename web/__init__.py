"""The web service: JSON API, server-rendered console and authentication for people.

It reads the database as ``triloop_web``, asks OPA before every request it serves,
and reaches the loops only through Temporal (start, signal, update), never by import.
"""
