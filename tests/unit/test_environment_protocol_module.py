"""The environment protocol's models stand alone: an outside service imports them without triloop.

Each import runs in a fresh interpreter whose import system refuses triloop's packages, so a
module that reached for one (even indirectly) fails here rather than in someone's service.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import triloop_environment_protocol
from execution_loop.environments import service_protocol
from tests.environment_services import SERVICE_DIR

ROOT = Path(__file__).resolve().parents[2]
TRILOOP_PACKAGES = ("triloop", "execution_loop", "learning_loop", "governance_loop", "web",
                    "verifier", "tests")
BLOCKER = textwrap.dedent(f"""
    import sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {TRILOOP_PACKAGES!r}:
                raise ImportError(f"{{name}} is triloop's, not the protocol's")
            return None

    sys.meta_path.insert(0, Refuse())
""")


def _run(code: str, *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_protocol_module_needs_only_the_standard_library_and_pydantic() -> None:
    done = _run("""
        import sys
        import triloop_environment_protocol as p
        p.ServiceInfo.model_validate({"task": "t", "verifier_digest": "a" * 64, "capabilities": {
            "actions": [], "observations": [], "success_criteria": [], "outcome_terms": []}})
        allowed = {"pydantic", "pydantic_core", "typing_extensions", "annotated_types",
                   "typing_inspection", "triloop_environment_protocol", "_distutils_hack",
                   "__main__"}
        outside = sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
                         - allowed)
        outside = [m for m in outside if not m.startswith("_sysconfigdata")]  # the interpreter's
        print("outside:", outside)
        assert not outside, outside
    """, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "outside: []" in done.stdout


def test_a_refusing_import_system_really_refuses() -> None:
    """The check above means something: importing triloop under it fails."""
    done = _run("import execution_loop.environments.service_protocol\n", cwd=ROOT)
    assert done.returncode != 0 and "is triloop's, not the protocol's" in done.stderr


def test_the_reference_service_imports_the_standalone_models_not_triloops() -> None:
    done = _run("""
        import sys
        sys.path.insert(0, ".")
        import letter_service
        assert letter_service.ServiceInfo.__module__ == "triloop_environment_protocol"
        print(letter_service.info().task)
    """, cwd=SERVICE_DIR)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "letter_count_service"


def test_triloops_client_uses_the_same_models() -> None:
    assert service_protocol.ServiceInfo is triloop_environment_protocol.ServiceInfo
    assert service_protocol.PROTOCOL == triloop_environment_protocol.PROTOCOL
