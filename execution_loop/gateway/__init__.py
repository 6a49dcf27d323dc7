"""The model gateway for black-box agents: OpenAI Chat Completions and Responses and
Anthropic Messages in front of the configured ``PolicyClient``, recording per agent
session what was sampled and rebuilding the main loop's trajectory (see ``session``,
``classify``, ``rebuild``, ``http_server``)."""
