package triloop.authz

# METADATA
# title: loop separation ("never" rules)
# description: >-
#   Denials that hold whatever the permission table says, so that a mistaken
#   grant cannot open them: the learning loop never touches what judges it, the
#   execution loop never changes contracts or eval data, governance never trains,
#   the audit log is append-only, frozen things stay frozen, admins never approve.
#   judging_kinds are what judges a candidate or releases it to production.
# scope: document
judging_kinds := {
	"eval_set", "eval_item", "threshold",
	"promotion", "gate_result", "approval", "deployment", "routing",
}

# What defines the tasks and their rewards.
contract_kinds := {"environment", "environment_version", "task"}

# What only the learning loop produces.
training_kinds := {"training_run", "training_step", "checkpoint", "proposal"}

# Decisions that move a candidate towards or away from production.
release_actions := {
	"approve", "reject", "sign_audit", "reject_audit", "override_alarms",
	"promote", "rollback", "route",
}

deny_reasons contains sprintf(
	"the %s loop may never %s: a loop cannot release or judge a candidate",
	[service, action],
) if {
	service in {"learning", "execution"}
	action in release_actions
}

deny_reasons contains sprintf(
	"the learning loop may never %s %s: the loop that learns cannot touch what judges it",
	[action, kind],
) if {
	service == "learning"
	action in write_actions
	kind in judging_kinds
}

deny_reasons contains sprintf(
	"the %s loop may never %s %s: environment contracts and reward rules belong to governance",
	[service, action, kind],
) if {
	service in {"learning", "execution"}
	action in write_actions
	kind in contract_kinds
}

deny_reasons contains "the learning loop may never read eval items: it would train on its own exam" if {
	service == "learning"
	kind == "eval_item"
}

deny_reasons contains sprintf(
	"the execution loop may never %s %s: it records episodes, it does not judge or train",
	[action, kind],
) if {
	service == "execution"
	action in write_actions
	kind in (judging_kinds | training_kinds)
}

deny_reasons contains sprintf(
	"the governance loop may never %s %s: governance never trains, edits a checkpoint or rewrites evidence",
	[action, kind],
) if {
	service == "governance"
	action in write_actions
	kind in {"checkpoint", "training_step", "trajectory", "step"}
}

deny_reasons contains sprintf("audit_event is append-only: nobody may %s it", [action]) if {
	kind == "audit_event"
	action in write_actions
}

deny_reasons contains sprintf("%s %s is frozen and may not be %sd; create a new version", [
	kind, object.get(input.resource, "id", ""),
	action,
]) if {
	input.resource.attrs.frozen == true
	action in {"update", "delete"}
}

# What can be frozen; changing one needs the caller to state whether it is.
freezable_kinds := {"environment_version", "eval_set", "eval_item", "threshold"}

frozen_stated if is_boolean(input.resource.attrs.frozen)

# A missing fact denies: without resource.attrs.frozen the policy cannot tell a
# frozen eval set from an open one, so it assumes the worst.
deny_reasons contains sprintf(
	"%s %s: the frozen fact is missing (resource.attrs.frozen must be true or false) and a missing fact denies",
	[kind, object.get(input.resource, "id", "")],
) if {
	kind in freezable_kinds
	action in {"update", "delete"}
	not frozen_stated
}

# An admin grants roles, so an admin approving could approve with a role they
# gave themselves.
deny_reasons contains sprintf("%s is an admin; admins manage users and may never %s", [human.user, action]) if {
	action in {"approve", "override_alarms"}
	"admin" in human.roles
}

deny_reasons contains sprintf("%s may not %s their own user record", [human.user, action]) if {
	kind == "user"
	action in write_actions
	resource_id == human.user
}

# One decision may let in a set of episodes (execution's group writes): the set must list
# every trajectory it covers, one status and one step count each, so the decision and its
# audit event name each episode. A lone episode carries no trajectory_ids.
trajectory_set_listed(attrs) if {
	is_array(attrs.trajectory_ids)
	count(attrs.trajectory_ids) > 0
	every id in attrs.trajectory_ids {
		is_string(id)
		id != ""
	}
	count(attrs.statuses) == count(attrs.trajectory_ids)
	count(attrs.num_steps) == count(attrs.trajectory_ids)
}

deny_reasons contains "a set of trajectories must list every episode it covers (resource.attrs.trajectory_ids, with one status and one num_steps each)" if {
	kind == "trajectory"
	action == "create"
	"trajectory_ids" in object.keys(input.resource.attrs)
	not trajectory_set_listed(input.resource.attrs)
}
