package triloop.authz_test

import data.triloop.authz

candidate(user, roles, action, attrs) := {
	"actor": {"service": "web", "user": user, "roles": roles},
	"action": action,
	"resource": {"kind": "promotion", "id": "p1", "attrs": attrs},
}

test_submitter_may_not_sign_the_audit if {
	denied_because(
		candidate("sam", ["auditor"], "sign_audit", {"submitted_by": "sam"}),
		"sam submitted the run and may not sign_audit its candidate",
	)
	allowed(candidate("ada", ["auditor"], "sign_audit", {"submitted_by": "sam"}))
}

test_submitter_may_not_approve if {
	denied_because(
		candidate("sam", ["operator"], "approve", {"submitted_by": " SAM", "audited_by": "ada"}),
		"sam submitted the run and may not approve its candidate",
	)
}

test_auditor_who_signed_may_not_approve if {
	denied_because(
		candidate("ada", ["operator", "auditor"], "approve", {"submitted_by": "sam", "audited_by": "ada"}),
		"ada signed the audit and may not also approve",
	)
	allowed(candidate("olga", ["operator"], "approve", {"submitted_by": "sam", "audited_by": "ada"}))
}

test_duty_checks_fail_closed_without_facts if {
	denied_because(candidate("ada", ["auditor"], "sign_audit", {}), "needs resource.attrs.submitted_by")
	denied_because(candidate("olga", ["operator"], "approve", {"submitted_by": "sam"}), "needs a signed audit first")
	denied_because(candidate("olga", ["operator"], "approve", {"submitted_by": "", "audited_by": "ada"}), "needs resource.attrs.submitted_by")
}

test_duties_hold_when_a_worker_acts_for_the_person if {
	inp := {
		"actor": {"service": "governance"},
		"action": "approve",
		"resource": {"kind": "promotion", "attrs": {"submitted_by": "sam", "audited_by": "ada"}},
		"context": {"on_behalf_of": {"user": "sam", "roles": ["operator"]}},
	}
	denied_because(inp, "sam submitted the run and may not approve")
}

test_rejecting_needs_no_audit if {
	allowed(candidate("olga", ["operator"], "reject", {"submitted_by": "sam"}))
}

promote(attrs) := {"actor": {"service": "governance"}, "action": "promote", "resource": {"kind": "promotion", "attrs": attrs}}

test_promote_needs_three_different_people if {
	allowed(promote({"submitted_by": "sam", "audited_by": "ada", "approved_by": "olga"}))
	denied_because(promote({"submitted_by": "sam", "audited_by": "ada"}), "promote needs resource.attrs.approved_by")
	denied_because(promote({"submitted_by": "sam", "approved_by": "olga"}), "promote needs resource.attrs.audited_by")
	denied_because(promote({"audited_by": "ada", "approved_by": "olga"}), "promote needs resource.attrs.submitted_by")
	denied_because(
		promote({"submitted_by": "sam", "audited_by": "ada", "approved_by": "Ada"}),
		"the audit and the approval were given by the same person",
	)
	denied_because(
		promote({"submitted_by": "sam", "audited_by": "sam", "approved_by": "olga"}),
		"the submitter sam also audited the candidate",
	)
	denied_because(
		promote({"submitted_by": "sam", "audited_by": "ada", "approved_by": "sam"}),
		"the submitter sam also approved the candidate",
	)
}

run(user, action, owner) := {
	"actor": {"service": "web", "user": user, "roles": ["ml_engineer"]},
	"action": action,
	"resource": {"kind": "training_run", "id": "run-1", "owner": owner},
}

test_engineers_control_only_their_own_runs if {
	every action in authz.owner_actions {
		allowed(run("uma", action, "uma"))
		denied_because(run("uma", action, "vic"), sprintf("uma may %s only their own runs", [action]))
		denied_because(run("uma", action, null), sprintf("%s on a training run needs resource.owner", [action]))
	}
}

test_learning_pauses_its_own_run_without_an_owner if {
	allowed(svc("learning", "pause", "training_run"))
	denied(svc("learning", "cancel", "training_run"))
	denied(svc("learning", "resume", "training_run"))
}

role_grant(user, action, attrs) := {
	"actor": {"service": "web", "user": user, "roles": ["admin"]},
	"action": action,
	"resource": {"kind": "role_grant", "id": "g1", "attrs": attrs},
}

test_a_second_admin_decides_a_role_grant if {
	allowed(role_grant("bea", "confirm", {"requested_by": "ann"}))
	allowed(role_grant("bea", "refuse", {"requested_by": "ann"}))
	allowed(role_grant("ann", "create", {}))
}

test_the_requester_may_not_decide_their_own_grant if {
	denied_because(role_grant("ann", "confirm", {"requested_by": " ANN"}), "two-person rule: ann requested")
	denied_because(role_grant("ann", "refuse", {"requested_by": "ann"}), "may not refuse it")
}

test_deciding_a_grant_without_its_requester_denies if {
	denied_because(role_grant("bea", "confirm", {}), "confirm a role grant needs resource.attrs.requested_by")
	denied_because(role_grant("bea", "refuse", {"requested_by": ""}), "needs resource.attrs.requested_by")
}

test_only_admins_handle_role_grants if {
	inp := object.union(role_grant("olga", "confirm", {"requested_by": "ann"}), {"actor": {"roles": ["operator", "auditor"]}})
	denied_because(inp, "no rule lets user olga")
	reading := object.union(role_grant("olga", "read", {}), {"actor": {"roles": ["operator"]}})
	denied_because(reading, "no rule lets user olga")
}

acting_for_at(action, opened_at, since) := {
	"actor": {"service": "governance"},
	"action": action,
	"resource": {"kind": "promotion", "id": "p1", "attrs": {
		"submitted_by": "sam", "audited_by": "ada",
		"promotion_opened_at": opened_at,
	}},
	"context": {"on_behalf_of": {"user": "olga", "roles": ["operator", "auditor"], "role_since": since}},
}

test_a_role_held_since_before_the_promotion_decides if {
	allowed(acting_for_at("approve", "2026-11-30T10:00:00Z", "2026-11-29T10:00:00.5Z"))
	allowed(acting_for_at("approve", "2026-11-30T10:00:00Z", "2026-11-30T12:00:00+02:00"))
}

test_a_role_newer_than_the_promotion_is_refused if {
	denied_because(
		acting_for_at("approve", "2026-11-30T10:00:00Z", "2026-11-30T10:00:00.000001Z"),
		"olga's role became active at 2026-11-30T10:00:00.000001Z, after the promotion opened",
	)
	inp := object.union(acting_for_at("sign_audit", "2026-11-30T10:00:00Z", "2026-12-01T00:00:00Z"), {"context": {"on_behalf_of": {"user": "ann"}}})
	denied_because(inp, "sign_audit needs a role held since before")
}

test_a_missing_role_age_fact_denies if {
	denied_because(acting_for_at("approve", "", "2026-11-29T10:00:00Z"), "approve needs resource.attrs.promotion_opened_at")
	denied_because(acting_for_at("approve", "2026-11-30T10:00:00Z", "yesterday"), "approve needs context.on_behalf_of.role_since")
	no_since := json.remove(acting_for_at("sign_audit", "2026-11-30T10:00:00Z", "x"), ["context/on_behalf_of/role_since"])
	denied_because(no_since, "sign_audit needs context.on_behalf_of.role_since")
}

test_rejections_need_no_role_age if {
	allowed(acting_for_at("reject", "2026-11-30T10:00:00Z", "2026-12-01T00:00:00Z"))
}

# An operator's override of a candidate's stability alarms: the run's submitter may not,
# an operator role is needed, an admin never, and the role must predate the promotion.
test_an_operator_overrides_the_alarms_of_someone_elses_run if {
	allowed(candidate("olga", ["operator"], "override_alarms", {"submitted_by": "sam"}))
	allowed(acting_for_at("override_alarms", "2026-11-30T10:00:00Z", "2026-11-29T10:00:00Z"))
}

test_the_submitter_may_not_override_their_runs_alarms if {
	denied_because(
		candidate("sam", ["operator"], "override_alarms", {"submitted_by": " Sam"}),
		"sam submitted the run and may not override_alarms its candidate",
	)
	denied_because(
		candidate("olga", ["operator"], "override_alarms", {}),
		"override_alarms needs resource.attrs.submitted_by",
	)
}

test_overriding_alarms_needs_the_operator_role if {
	denied_because(
		candidate("ada", ["auditor", "ml_engineer"], "override_alarms", {"submitted_by": "sam"}),
		"no rule lets user ada",
	)
	denied_because(
		candidate("root", ["operator", "admin"], "override_alarms", {"submitted_by": "sam"}),
		"admins manage users and may never override_alarms",
	)
}

test_an_override_with_a_role_newer_than_the_promotion_is_refused if {
	denied_because(
		acting_for_at("override_alarms", "2026-11-30T10:00:00Z", "2026-11-30T11:00:00Z"),
		"needs a role held since before",
	)
}

test_no_loop_overrides_alarms_on_its_own if {
	denied(promote_as("learning", "override_alarms"))
	denied(promote_as("governance", "override_alarms"))
}

promote_as(service, action) := {
	"actor": {"service": service},
	"action": action,
	"resource": {"kind": "promotion", "id": "p1", "attrs": {"submitted_by": "sam"}},
}
