package triloop.authz_test

deciding_at(action, roles, opened_at, since) := {
	"actor": {"service": "web", "user": "olga", "roles": roles},
	"action": action,
	"resource": {"kind": "promotion", "id": "p1", "attrs": {
		"submitted_by": "sam", "audited_by": "ada",
		"promotion_opened_at": opened_at, "role_since": since,
	}},
}

test_the_web_refuses_a_role_newer_than_the_promotion if {
	denied_because(
		deciding_at("approve", ["operator"], "2026-11-30T10:00:00Z", "2026-11-30T10:00:00.000001Z"),
		"olga's operator role became active at 2026-11-30T10:00:00.000001Z, after this promotion opened",
	)
	denied_because(
		deciding_at("override_alarms", ["operator"], "2026-11-30T10:00:00Z", "2026-12-01T00:00:00Z"),
		"a role must predate the promotion it decides on, so another operator whose role does must override its alarms",
	)
	denied_because(
		deciding_at("sign_audit", ["auditor"], "2026-11-30T10:00:00Z", "2026-12-01T00:00:00Z"),
		"olga's auditor role became active",
	)
}

test_the_web_allows_a_role_that_predates_the_promotion if {
	allowed(deciding_at("approve", ["operator"], "2026-11-30T10:00:00Z", "2026-11-30T10:00:00Z"))
	allowed(deciding_at("sign_audit", ["auditor"], "2026-11-30T10:00:00Z", "2026-11-29T10:00:00.5Z"))
}

test_the_web_lets_a_newer_role_reject if {
	allowed(deciding_at("reject", ["operator"], "2026-11-30T10:00:00Z", "2026-12-01T00:00:00Z"))
	allowed(deciding_at("reject_audit", ["auditor"], "2026-11-30T10:00:00Z", "2026-12-01T00:00:00Z"))
}
