"""The model gateway for black-box agents: OpenAI Chat Completions and Responses and
Anthropic Messages in front of the configured ``PolicyClient``, recording per agent
session what was sampled and rebuilding the main loop's trajectory (see ``api_shapes``
and ``api_bodies``, ``session``, ``sampling``, ``streams``, ``classify``, ``rebuild``,
``http_server``)."""
