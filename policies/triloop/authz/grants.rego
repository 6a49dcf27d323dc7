package triloop.authz

# METADATA
# title: permission table
# description: >-
#   What each loop service may do on its own, what each human role may do, and
#   which human decisions a loop worker may carry out for a person. A request is
#   allowed only when one of these grants it and no rule in invariants.rego or
#   duties.rego denies it. service_grants lists each loop's own identity: only
#   what that loop needs, everything missing is denied.
# scope: document
service_grants := {
	"execution": {
		"environment": {"read"},
		"environment_version": {"read"},
		"task": {"read"},
		"task_set": {"read"},
		# Offline eval and shadow/canary episodes run in the execution loop.
		"eval_set": {"read"},
		"eval_item": {"read"},
		"training_run": {"read"},
		"checkpoint": {"read"},
		"deployment": {"read"},
		"routing": {"read"},
		"trajectory": {"read", "create", "update"},
		"step": {"read", "create"},
	},
	"learning": {
		"environment": {"read"},
		"environment_version": {"read"},
		"task": {"read"},
		# No eval_set, eval_item or threshold, not even read: the database refuses
		# the learning role those tables too (migration 0002), and a loop that saw the
		# held-out items or the bars could let its score buy itself a promotion.
		# Stability monitors may pause their own run without a person.
		"training_run": {"read", "update", "pause"},
		"training_step": {"read", "create"},
		"trajectory": {"read"},
		"step": {"read"},
		# delete: retention gives up old iterations' files (the database picks which).
		"checkpoint": {"read", "create", "propose", "delete"},
		"proposal": {"read", "create", "propose"},
		"promotion": {"read"},
		"gate_result": {"read"},
		"deployment": {"read"},
	},
	"governance": {
		"environment": {"read", "create", "update", "retire"},
		# Environment versions are immutable: no update.
		"environment_version": {"read", "create", "freeze", "retire"},
		"task": {"read", "create", "update", "admit", "reject_task", "retire"},
		# A task set and its members are written once, at registration; it is admitted or
		# rejected as one unit (update: its admission's evidence), its member tasks with it.
		"task_set": {"read", "create", "update", "admit", "reject"},
		"eval_set": {"read", "create", "update", "freeze", "retire"},
		"eval_item": {"read", "create", "update", "delete"},
		"threshold": {"read", "create", "update", "freeze", "retire"},
		"training_run": {"read"},
		"training_step": {"read"},
		"trajectory": {"read"},
		"step": {"read"},
		"checkpoint": {"read"},
		"proposal": {"read", "update"},
		"promotion": {"read", "create", "update", "promote"},
		"gate_result": {"read", "create"},
		# Approvals are written under the operator's own approve decision.
		"approval": {"read"},
		"deployment": {"read", "create", "update", "rollback"},
		"routing": {"read", "create", "update", "route"},
		"audit_event": {"read"},
		# Governance records its own eval batches (and their planned episodes) before it
		# asks execution for them: execution's handler only checks the row.
		"rollout_batch": {"read", "create"},
	},
}

# What each role may read. ML engineers see what they need to follow their runs;
# eval items stay hidden from them for the same reason as from the learning loop.
# Everyone lists their own API tokens (below); admins and auditors anyone's.
role_reads := {
	"ml_engineer": kinds - {"eval_item", "approval", "audit_event", "user", "api_token", "role_grant", "webhook"},
	"operator": kinds - {"user", "api_token", "role_grant"},
	"auditor": kinds,
	"admin": {"user", "audit_event", "api_token", "role_grant"},
}

# What each role may do beyond reading.
role_grants := {
	# Only on their own runs: see duties.rego. Importing a pretrained model registers a
	# base checkpoint (the learning loop writes it): ML engineers bring the models they
	# train, operators the ones a deployment starts from. Neither decides a release by it:
	# a base only reaches production through a run, its proposal and every gate.
	"ml_engineer": {
		"training_run": {"submit", "cancel", "pause", "resume"},
		"checkpoint": {"import"},
	},
	"operator": {
		"checkpoint": {"import"},
		# override_alarms: let a candidate past its run's stability alarms, with a reason.
		"promotion": {"approve", "reject", "override_alarms"},
		"deployment": {"rollback"},
		"task": {"admit", "reject_task"},
		# Register a new environment version (POST /api/environments), create and freeze
		# an eval set version (POST /api/eval-sets), set a threshold version (POST
		# /api/thresholds); governance writes each, acting for the operator. Versions
		# are new rows: no operator may update or delete one.
		"environment_version": {"create"},
		"eval_set": {"create", "freeze"},
		"eval_item": {"create"},
		"threshold": {"create"},
		# Register a task set (POST /api/task-sets): governance writes it for the operator;
		# one decision admits or rejects it whole (POST /api/task-sets/{id}/admission).
		"task_set": {"create", "admit", "reject"},
		# Production traffic: an operator may send episodes to the routed checkpoint.
		"trajectory": {"create"},
		# Game days: serve a checkpoint degraded on purpose (see faults.rego).
		"serving_fault": {"inject_fault", "clear_fault"},
		# Notifications: make and disable the webhooks events are sent to (webhooks.rego).
		"webhook": {"create", "delete"},
	},
	"auditor": {
		"promotion": {"sign_audit", "reject_audit"},
		"audit_event": {"verify"},
	},
	# An admin may shut off anyone's token. Issuing one for another person happens only
	# on the server machine (`triloop users token`); the API issues tokens to their owner.
	"admin": {
		"user": {"create", "update", "delete"},
		"api_token": {"create", "revoke"},
		# A privileged role is requested by one admin and confirmed by another
		# (duties.rego): no admin alone can supply the second person.
		"role_grant": {"create", "confirm", "refuse"},
	},
}

role_may(role, act, knd) if {
	act == "read"
	knd in role_reads[role]
}

role_may(role, act, knd) if act in role_grants[role][knd]

# Human decisions a loop worker executes after the web service was allowed to
# send them: the person must hold the grant too, and duties are checked
# against the person.
delegable := {
	"governance": {
		"promotion": {"approve", "reject", "sign_audit", "reject_audit", "override_alarms"},
		"deployment": {"rollback"},
		"task": {"admit", "reject_task"},
		"task_set": {"create", "admit", "reject"},
		"environment_version": {"create"},
		"eval_set": {"create", "freeze"},
		"eval_item": {"create"},
		"threshold": {"create"},
	},
	"learning": {"training_run": {"cancel", "pause", "resume"}},
}

grant_reasons contains sprintf("service %s may %s %s", [service, action, kind]) if {
	mode == "service"
	action in service_grants[service][kind]
}

grant_reasons contains sprintf("role %s may %s %s", [role, action, kind]) if {
	mode == "human"
	actor_user
	some role in actor_roles
	role_may(role, action, kind)
}

grant_reasons contains sprintf("%s may %s %s for %s, whose role %s may", [
	service, action, kind,
	on_behalf_of_user, role,
]) if {
	mode == "delegated"
	action in delegable[service][kind]
	some role in on_behalf_of_roles
	role_may(role, action, kind)
}

# Anyone signed in manages their own API tokens; the owner is read from the database.
grant_reasons contains sprintf("user %s may %s their own API tokens", [human.user, action]) if {
	mode == "human"
	kind == "api_token"
	action in {"read", "create", "revoke"}
	resource_owner == human.user
}

# Anyone signed in may read their own user record.
grant_reasons contains sprintf("user %s may read their own user record", [human.user]) if {
	mode == "human"
	kind == "user"
	action == "read"
	resource_id == human.user
}
