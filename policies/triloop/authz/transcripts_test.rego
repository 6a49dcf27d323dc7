package triloop.authz_test

import data.triloop.authz

reader(user, roles) := {"service": "web", "user": user, "roles": roles}

read_transcript(actor, attrs) := {
	"actor": actor,
	"action": "read",
	"resource": {"kind": "trajectory", "id": "ep-1", "attrs": attrs},
}

test_auditors_and_operators_read_judged_transcripts if {
	every purpose in authz.judged_purposes {
		allowed(read_transcript(reader("ada", ["auditor"]), {"purpose": purpose}))
		allowed(read_transcript(reader("olga", ["operator"]), {"purpose": purpose}))
	}
}

test_an_engineer_may_not_read_judged_transcripts if {
	every purpose in authz.judged_purposes {
		denied_because(
			read_transcript(reader("sam", ["ml_engineer"]), {"purpose": purpose, "submitted_by": "sam"}),
			"read by auditors and operators only; sam holds roles ml_engineer",
		)
	}
}

test_an_admin_reads_no_transcript if {
	denied_because(read_transcript(reader("root", ["admin"]), {"purpose": "eval"}), "auditors and operators only")
	denied_because(
		read_transcript(reader("root", ["admin"]), {"purpose": "training", "submitted_by": "sam"}),
		"the ML engineer who submitted the run (sam)",
	)
}

test_an_engineer_reads_their_own_runs_training_transcripts if {
	allowed(read_transcript(reader("sam", ["ml_engineer"]), {"purpose": "training", "submitted_by": "Sam "}))
}

test_another_engineer_or_an_operator_may_not_read_training_transcripts if {
	denied_because(
		read_transcript(reader("eve", ["ml_engineer"]), {"purpose": "training", "submitted_by": "sam"}),
		"submitted the run (sam) and by auditors; eve holds roles ml_engineer",
	)
	denied_because(
		read_transcript(reader("olga", ["operator"]), {"purpose": "training", "submitted_by": "sam"}),
		"olga holds roles operator",
	)
}

test_auditors_read_training_transcripts if {
	allowed(read_transcript(reader("ada", ["auditor"]), {"purpose": "training", "submitted_by": "sam"}))
}

test_a_missing_fact_denies if {
	denied_because(read_transcript(reader("ada", ["auditor"]), {}), "needs resource.attrs.purpose")
	denied_because(read_transcript(reader("ada", ["auditor"]), {"purpose": "exam"}), "needs resource.attrs.purpose")
	denied_because(
		read_transcript(reader("sam", ["ml_engineer"]), {"purpose": "training"}),
		"needs resource.attrs.submitted_by",
	)
}

test_a_person_without_roles_is_told_so if {
	denied_because(read_transcript(reader("nobody", []), {"purpose": "eval"}), "nobody holds no role")
}

test_loops_keep_their_own_grants if {
	allowed({"actor": {"service": "learning"}, "action": "read", "resource": {"kind": "trajectory"}})
	allowed({"actor": {"service": "governance"}, "action": "read", "resource": {"kind": "trajectory"}})
}
