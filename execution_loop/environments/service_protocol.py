"""The environment-service protocol's models, as triloop's client imports them.

They live in the standalone module ``triloop_environment_protocol`` (stdlib and pydantic
only), which an outside service imports without triloop; this name stays for triloop's own
code.
"""

from triloop_environment_protocol import (
    PROTOCOL,
    Observation,
    ReferenceReply,
    ResetRequest,
    ServiceCapabilities,
    ServiceInfo,
    StepReply,
    StepRequest,
    Verdict,
)

__all__ = ["PROTOCOL", "Observation", "ReferenceReply", "ResetRequest", "ServiceCapabilities",
           "ServiceInfo", "StepReply", "StepRequest", "Verdict"]
