package triloop.authz

# METADATA
# title: vocabulary and input checks
# description: >-
#   The closed sets of services, roles, resource kinds and actions, which action
#   applies to which kind, and the denials for input that names anything else or
#   is shaped wrongly. Matching is exact after norm() in decision.rego.
# scope: document
services := {"execution", "learning", "governance", "web"}

loop_services := {"execution", "learning", "governance"}

roles := {"ml_engineer", "operator", "auditor", "admin"}

kinds := {
	"environment", "environment_version", "task", "task_set",
	"eval_set", "eval_item", "threshold",
	"training_run", "training_step", "trajectory", "step", "checkpoint",
	"proposal", "promotion", "gate_result", "approval", "deployment", "routing",
	"audit_event", "user", "serving_fault", "api_token", "role_grant",
	"nexus_operation", "rollout_batch", "webhook",
}

actions := {
	"read", "create", "update", "delete",
	"admit", "reject_task", "retire", "freeze",
	"propose", "submit", "cancel", "pause", "resume",
	"approve", "reject", "sign_audit", "reject_audit", "override_alarms",
	"promote", "rollback", "route", "verify",
	"inject_fault", "clear_fault", "revoke",
	"confirm", "refuse",
	"serve",
	"import",
}

# Everything but looking: used by the "never" rules.
write_actions := actions - {"read", "verify"}

# The kinds each domain action applies to; read/create/update/delete apply to all.
applies_to := {
	"admit": {"task", "task_set"},
	"reject_task": {"task"},
	"retire": {"environment", "environment_version", "task", "eval_set", "threshold"},
	"freeze": {"environment_version", "eval_set", "threshold"},
	"propose": {"proposal", "checkpoint"},
	"submit": {"training_run"},
	"cancel": {"training_run"},
	"pause": {"training_run"},
	"resume": {"training_run"},
	"approve": {"promotion"},
	"reject": {"promotion", "task_set"},
	"sign_audit": {"promotion"},
	"reject_audit": {"promotion"},
	"override_alarms": {"promotion"},
	"promote": {"promotion"},
	"rollback": {"deployment"},
	"route": {"routing"},
	"verify": {"audit_event"},
	"inject_fault": {"serving_fault"},
	"clear_fault": {"serving_fault"},
	"revoke": {"api_token"},
	"confirm": {"role_grant"},
	"refuse": {"role_grant"},
	"serve": {"nexus_operation"},
	"import": {"checkpoint"},
}

# Named rules rather than `not is_string(input.x)` inline: a negated builtin
# call on an undefined reference does not evaluate to true.
action_given if is_string(input.action)

kind_given if is_string(input.resource.kind)

service_given if is_string(input.actor.service)

deny_reasons contains "input.action is missing or not a string" if not action_given

deny_reasons contains sprintf("unknown action %q", [input.action]) if {
	action_given
	not action in actions
}

deny_reasons contains "input.resource.kind is missing or not a string" if not kind_given

deny_reasons contains sprintf("unknown resource kind %q", [input.resource.kind]) if {
	kind_given
	not kind in kinds
}

deny_reasons contains sprintf("action %s does not apply to kind %s", [action, kind]) if {
	kind in kinds
	applicable := applies_to[action]
	not kind in applicable
}

deny_reasons contains "input.actor.service is missing or not a string" if not service_given

deny_reasons contains sprintf("unknown service %q", [input.actor.service]) if {
	service_given
	not service in services
}

deny_reasons contains "the web service acts only for a signed-in user: input.actor.user is missing" if {
	service == "web"
	not actor_user
}

# A loop worker never claims a user as itself; a person reaches a loop only
# through context.on_behalf_of, which is audited as such.
deny_reasons contains sprintf(
	"service %s may not name a user in actor.user; a loop acts for a person through context.on_behalf_of",
	[service],
) if {
	service in loop_services
	input.actor.user != null
}

deny_reasons contains "context.on_behalf_of must be an object {user, roles[]} naming the person" if {
	delegating
	not on_behalf_of_user
}
