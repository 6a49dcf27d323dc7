"""The words of the audit log: every action and resource kind a row may hold, as closed sets.

People filter the log by choosing from these (the console's selects, the API's enums and
the CLI's choices), never by guessing a spelling. Two sources, kept apart:
- what the policy decides on: ``policies/triloop/authz/vocabulary.rego``'s ``actions`` and
  ``kinds`` (a unit test keeps this list equal to them);
- what the loops and the web service record without asking the policy (a gate's verdict, a
  move, a refusal of a person's decision, an interruption), from the writers of
  ``triloop.audit.append_event``; the families are built from the enums they are made of.
"""

from __future__ import annotations

from enum import StrEnum

from triloop.statuses import DecisionKind, TaskStatus

POLICY_ACTIONS = (
    "read", "create", "update", "delete",
    "admit", "reject_task", "retire", "freeze",
    "propose", "submit", "cancel", "pause", "resume",
    "approve", "reject", "sign_audit", "reject_audit", "override_alarms",
    "promote", "rollback", "route", "verify",
    "inject_fault", "clear_fault", "revoke",
    "confirm", "refuse",
    "serve",
    "import",
)
POLICY_KINDS = (
    "environment", "environment_version", "task", "task_set",
    "eval_set", "eval_item", "threshold",
    "training_run", "training_step", "trajectory", "step", "checkpoint",
    "proposal", "promotion", "gate_result", "approval", "deployment", "routing",
    "audit_event", "user", "serving_fault", "api_token", "role_grant",
    "nexus_operation", "rollout_batch", "webhook",
)

# Facts a loop records: governance's gates, moves and admissions, learning's alarms, the
# verifier's and loaders' integrity checks, the policy's change of revision.
RECORDED_ACTIONS = (
    "gate_result", "open_promotion", "close_promotion", "bootstrap_production",
    "add_task", "assess_task", "assess_task_set", "register_task_set",
    "create_eval_set", "freeze_eval_set", "set_threshold",
    "stability_alarm", "stability_mitigation", "integrity_violation",
    "policy_revision_changed", "deliver_webhook",
    *(f"task_{s.value}" for s in TaskStatus), *(f"task_set_{s.value}" for s in TaskStatus),
    *(f"workflow_{k}" for k in ("reset", "terminated", "cancelled", "timed_out")),
)
# Refusals a loop records about what it was asked to do: a person's decision it would not
# carry out (``<kind>_decision``), a promotion change from a run that does not own it.
REFUSAL_ACTIONS = (
    *(f"{k.value}_decision" for k in DecisionKind),
    *(f"refuse_{a}" for a in ("promote", "rollback", "route", "record_gate", "mark_promotion",
                              "decide_offline_eval", "decide_shadow", "look_canary",
                              "look_watch", "audit_decision", "approval_decision",
                              "stability_decision")),
)
RECORDED_KINDS = ("workflow", "policy")

AuditAction = StrEnum(  # type: ignore[misc]
    "AuditAction", {a: a for a in dict.fromkeys(POLICY_ACTIONS + RECORDED_ACTIONS
                                                 + REFUSAL_ACTIONS)})
AuditAction.__doc__ = "An action an audit row may name (the policy's, or one a loop records)."
AuditKind = StrEnum(  # type: ignore[misc]
    "AuditKind", {k: k for k in dict.fromkeys(POLICY_KINDS + RECORDED_KINDS)})
AuditKind.__doc__ = "A resource kind an audit row may name."

# Production episodes people (and the demo's traffic) ask for: one allowed ``create`` on a
# ``trajectory`` each. The people's view leaves them out unless asked, so a person's own
# decisions are not buried under them.
TRAFFIC = ("create", "trajectory")

ACTION_GROUPS = (("decided by the policy", POLICY_ACTIONS),
                 ("recorded by a loop", RECORDED_ACTIONS),
                 ("refused by a loop", REFUSAL_ACTIONS))
