"""Environment contracts live in the shared kernel (``triloop.contracts``).

Governance versions and diffs contracts and the web shows them, and neither may
import the execution loop, so the schema moved to the kernel; import it from there.
"""

from triloop.contracts import *  # noqa: F403
from triloop.contracts import __all__ as __all__  # noqa: F401
