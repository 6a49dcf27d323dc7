"""Built-in environments, each with a contract file and a verifier.

Kept import-free on purpose: verifiers run in a separate interpreter started without
site-packages (see ``execution_loop.verification``), so importing this package must
not pull in pydantic or yaml. Import ``registry`` or an environment module directly.
"""
