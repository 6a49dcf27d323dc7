package triloop.authz_test

import data.triloop.authz

# Shared helpers for the authz tests (the package spans the *_test.rego files).
decide(inp) := d if {
	d := authz.decision with input as inp
}

allowed(inp) if decide(inp).allow == true

denied(inp) if decide(inp).allow == false

denied_because(inp, fragment) if {
	d := decide(inp)
	d.allow == false
	some reason in d.reasons
	contains(reason, fragment)
}

svc(service, action, kind) := {
	"actor": {"service": service, "roles": []},
	"action": action,
	"resource": {"kind": kind, "id": "r1"},
}

person(user, roles, action, kind) := {
	"actor": {"service": "web", "user": user, "roles": roles},
	"action": action,
	"resource": {"kind": kind, "id": "r1"},
}

test_allowed_decision_names_its_grant if {
	d := decide(svc("learning", "create", "checkpoint"))
	d == {"allow": true, "reasons": ["service learning may create checkpoint"]}
}

test_empty_input_is_denied_with_reasons if {
	d := decide({})
	d.allow == false
	count(d.reasons) == 3
}

test_wrong_types_are_denied if {
	d := decide({"actor": {"service": 7}, "action": ["read"], "resource": {"kind": null}})
	d.allow == false
	"input.action is missing or not a string" in d.reasons
	"input.resource.kind is missing or not a string" in d.reasons
	"input.actor.service is missing or not a string" in d.reasons
}

test_kind_action_and_service_are_normalised if {
	allowed(svc(" Learning ", "CREATE", "\tCheckPoint "))
	allowed(person(" Uma ", [" ML_Engineer"], " Read", "TRAINING_RUN "))
}

test_normalisation_does_not_open_a_never if {
	denied_because(svc("LEARNING", " Create ", " EVAL_SET"), "may never create eval_set")
}

test_unknown_kind_is_denied_by_name if {
	denied_because(svc("learning", "read", "checkpoints"), "unknown resource kind \"checkpoints\"")
	denied_because(svc("learning", "read", ""), "unknown resource kind \"\"")
}

test_unknown_action_is_denied_by_name if {
	denied_because(svc("governance", "obliterate", "routing"), "unknown action \"obliterate\"")
}

test_unknown_service_is_denied_by_name if {
	denied_because(svc("billing", "read", "task"), "unknown service \"billing\"")
}

test_action_outside_its_kinds_is_denied if {
	denied_because(svc("governance", "route", "promotion"), "action route does not apply to kind promotion")
}

test_web_needs_a_user if {
	denied_because(svc("web", "read", "task"), "acts only for a signed-in user")
	denied_because(person("  ", ["operator"], "read", "task"), "acts only for a signed-in user")
}

test_loop_may_not_name_a_user if {
	inp := {"actor": {"service": "governance", "user": "olga"}, "action": "read", "resource": {"kind": "task"}}
	denied_because(inp, "through context.on_behalf_of")
}

test_malformed_on_behalf_of_is_denied if {
	inp := object.union(svc("governance", "rollback", "deployment"), {"context": {"on_behalf_of": "olga"}})
	denied_because(inp, "context.on_behalf_of must be an object")
}

test_denial_names_who_was_refused if {
	denied_because(svc("execution", "read", "audit_event"), "no rule lets service execution read audit_event")
	denied_because(person("uma", ["ml_engineer"], "read", "audit_event"), "user uma (roles: ml_engineer) via web")
	inp := object.union(svc("governance", "approve", "promotion"), {"context": {"on_behalf_of": {"user": "uma", "roles": ["ml_engineer"]}}})
	denied_because(inp, "governance acting for uma (roles: ml_engineer)")
	denied_because({"action": "read", "resource": {"kind": "task"}}, "an unidentified caller")
}

test_person_without_roles_gets_nothing if {
	denied_because(person("nora", [], "read", "task"), "no rule lets user nora")
	denied(person("nora", ["superuser"], "read", "task"))
}
