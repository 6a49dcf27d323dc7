"""Policy inference: the ``PolicyClient`` interface and its backends.

Import the submodule you need (``base``, ``torch_backend``, ``openai_backend``, ``server``);
nothing is imported here so that importing the package never pulls in torch.
"""
