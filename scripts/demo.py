"""The main job: bring the stack up, migrate, show its status.

Later steps (register environments, train, gate, promote, roll back) are
added as the loops land; see issue 8.
"""

from __future__ import annotations

import subprocess
import sys


def main() -> int:
    """Run the demo; return the exit status."""
    triloop = [sys.executable, "-m", "triloop.cli"]
    for args in (["dev", "up"], ["migrate"], ["dev", "status"]):
        result = subprocess.run([*triloop, *args], check=False)
        if result.returncode != 0:
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
