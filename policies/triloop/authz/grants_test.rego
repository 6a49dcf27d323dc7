package triloop.authz_test

import data.triloop.authz

# Facts that satisfy every duty check (and say that nothing is frozen), so that these
# tests see the table alone.
clean_attrs := {
	"submitted_by": "sam", "audited_by": "ada", "approved_by": "olga", "frozen": false,
	"requested_by": "ann", "promotion_opened_at": "2026-06-01T00:00:00Z",
}

svc_clean(service, action, kind) := {
	"actor": {"service": service},
	"action": action,
	"resource": {"kind": kind, "id": "r1", "attrs": clean_attrs},
}

person_clean(user, roles, action, kind) := {
	"actor": {"service": "web", "user": user, "roles": roles},
	"action": action,
	"resource": {"kind": kind, "id": "someone-else", "owner": user, "attrs": clean_attrs},
}

granted_to_service(service, kind, action) if action in authz.service_grants[service][kind]

granted_to_role(role, kind, action) if authz.role_may(role, action, kind)

# Either the table grants it, or the decision denies it.
service_table_holds(service, kind, action) if granted_to_service(service, kind, action)

service_table_holds(service, kind, action) if {
	not granted_to_service(service, kind, action)
	denied(svc_clean(service, action, kind))
}

role_table_holds(role, kind, action) if granted_to_role(role, kind, action)

# person_clean makes uma the owner: her own API tokens are hers whatever her role.
role_table_holds(_, kind, action) if own_token(kind, action)

role_table_holds(role, kind, action) if {
	not granted_to_role(role, kind, action)
	not own_token(kind, action)
	denied(person_clean("uma", [role], action, kind))
}

own_token(kind, action) if {
	kind == "api_token"
	action in {"read", "create", "revoke"}
}

test_every_service_grant_is_allowed if {
	every service, table in authz.service_grants {
		every kind, granted in table {
			every action in granted {
				allowed(svc_clean(service, action, kind))
			}
		}
	}
}

test_services_get_nothing_outside_their_table if {
	every service in authz.loop_services {
		every kind in authz.kinds {
			every action in authz.actions {
				service_table_holds(service, kind, action)
			}
		}
	}
}

test_every_role_grant_is_allowed if {
	every role, readable in authz.role_reads {
		# A transcript's read needs its facts (purpose, submitter): transcripts_test.rego.
		every kind in readable - {"trajectory"} {
			allowed(person_clean("uma", [role], "read", kind))
		}
	}
	every role, table in authz.role_grants {
		every kind, granted in table {
			every action in granted {
				allowed(person_clean("uma", [role], action, kind))
			}
		}
	}
}

test_roles_get_nothing_outside_their_table if {
	every role in authz.roles {
		every kind in authz.kinds {
			every action in authz.actions {
				role_table_holds(role, kind, action)
			}
		}
	}
}

for_person(service, action, kind, user, roles) := {
	"actor": {"service": service},
	"action": action,
	"resource": {"kind": kind, "id": "r1", "owner": "uma", "attrs": clean_attrs},
	"context": {"on_behalf_of": {"user": user, "roles": roles, "role_since": "2026-01-01T00:00:00Z"}},
}

test_governance_carries_out_a_persons_decision if {
	allowed(for_person("governance", "approve", "promotion", "olga", ["operator"]))
	allowed(for_person("governance", "reject", "promotion", "olga", ["operator"]))
	allowed(for_person("governance", "sign_audit", "promotion", "ada", ["auditor"]))
	allowed(for_person("governance", "reject_audit", "promotion", "ada", ["auditor"]))
	allowed(for_person("governance", "rollback", "deployment", "olga", ["operator"]))
}

test_delegation_needs_the_persons_own_grant if {
	denied_because(
		for_person("governance", "approve", "promotion", "uma", ["ml_engineer"]),
		"no rule lets governance acting for uma",
	)
	denied(for_person("governance", "rollback", "deployment", "ada", ["auditor"]))
	denied(for_person("governance", "approve", "promotion", "nobody", []))
}

test_delegation_covers_only_human_decisions if {
	# The worker's own acts (promote, route, writes) go without on_behalf_of.
	denied(for_person("governance", "promote", "promotion", "olga", ["operator"]))
	denied(for_person("governance", "update", "routing", "olga", ["operator"]))
	denied(for_person("execution", "read", "task", "olga", ["operator"]))
}

test_learning_carries_out_an_engineers_run_control if {
	allowed(for_person("learning", "cancel", "training_run", "uma", ["ml_engineer"]))
	allowed(for_person("learning", "resume", "training_run", "uma", ["ml_engineer"]))
	denied_because(
		for_person("learning", "cancel", "training_run", "vic", ["ml_engineer"]),
		"vic may cancel only their own runs; this run belongs to uma",
	)
	denied(for_person("learning", "cancel", "training_run", "olga", ["operator"]))
}

test_people_read_their_own_user_record if {
	inp := {
		"actor": {"service": "web", "user": "Uma", "roles": []},
		"action": "read",
		"resource": {"kind": "user", "id": " uma"},
	}
	allowed(inp)
	denied(json.patch(inp, [{"op": "replace", "path": "/resource/id", "value": "vic"}]))
}

admission_for(person, roles, action) := {
	"actor": {"service": "governance"},
	"action": action,
	"resource": {"kind": "task", "id": "t1", "attrs": {}},
	"context": {"on_behalf_of": {"user": person, "roles": roles}},
}

test_governance_admits_a_task_for_an_operator if {
	allowed(admission_for("olga", ["operator"], "admit"))
	allowed(admission_for("olga", ["operator"], "reject_task"))
}

test_governance_cannot_admit_for_an_ml_engineer if {
	denied(admission_for("maya", ["ml_engineer"], "admit"))
}

task_set_admission_for(person, roles, action) := json.patch(
	admission_for(person, roles, action),
	[{"op": "replace", "path": "/resource/kind", "value": "task_set"}],
)

test_governance_admits_or_rejects_a_task_set_for_an_operator_only if {
	allowed(task_set_admission_for("olga", ["operator"], "admit"))
	allowed(task_set_admission_for("olga", ["operator"], "reject"))
	denied(task_set_admission_for("maya", ["ml_engineer"], "admit"))
	denied(task_set_admission_for("aude", ["auditor"], "reject"))
	denied(task_set_admission_for("olga", ["operator"], "reject_task"))
}

test_learning_and_execution_never_admit_a_task_set if {
	denied({
		"actor": {"service": "learning"}, "action": "admit",
		"resource": {"kind": "task_set", "id": "s1", "attrs": {}},
	})
	denied({
		"actor": {"service": "execution"}, "action": "reject",
		"resource": {"kind": "task_set", "id": "s1", "attrs": {}},
	})
}

token_of(owner, user, roles, action) := {
	"actor": {"service": "web", "user": user, "roles": roles},
	"action": action,
	"resource": {"kind": "api_token", "id": "tok-1", "owner": owner, "attrs": {}},
}

test_people_manage_their_own_tokens_only if {
	every action in ["read", "create", "revoke"] {
		allowed(token_of("uma", "uma", ["ml_engineer"], action))
		denied(token_of("vic", "uma", ["ml_engineer"], action))
		denied(token_of("vic", "uma", ["operator"], action))
	}

	# A missing owner is a missing fact: only a role that may act on anyone's tokens passes.
	denied(json.remove(token_of("uma", "uma", ["ml_engineer"], "revoke"), ["resource/owner"]))
}

test_admins_list_and_revoke_anyones_tokens if {
	allowed(token_of("vic", "root", ["admin"], "read"))
	allowed(token_of("vic", "root", ["admin"], "revoke"))
	allowed(token_of("vic", "ada", ["auditor"], "read"))
	denied(token_of("vic", "ada", ["auditor"], "revoke"))
}

test_revoke_applies_to_tokens_only if {
	denied(person_clean("root", ["admin"], "revoke", "user"))
}

# The policy says what the database enforces: the learning role cannot SELECT eval
# sets, their items or thresholds (migration 0002), so the policy grants no read either.
test_learning_reads_nothing_the_database_hides_from_it if {
	every kind in {"eval_set", "eval_item", "threshold"} {
		not granted_to_service("learning", kind, "read")
		denied(svc_clean("learning", "read", kind))
	}
}

registration_by(user, roles) := {
	"actor": {"service": "web", "user": user, "roles": roles},
	"action": "create",
	"resource": {"kind": "environment_version", "attrs": {"environment": "frozen_lake"}},
}

registration_for(person, roles) := {
	"actor": {"service": "governance"},
	"action": "create",
	"resource": {"kind": "environment_version", "id": "v1", "attrs": {"environment": "frozen_lake"}},
	"context": {"on_behalf_of": {"user": person, "roles": roles}},
}

test_operators_register_environment_versions if {
	allowed(registration_by("olga", ["operator"]))
	allowed(registration_for("olga", ["operator"]))
}

test_others_do_not_register_environment_versions if {
	every roles in [["ml_engineer"], ["auditor"], ["admin"], []] {
		denied(registration_by("maya", roles))
		denied(registration_for("maya", roles))
	}
}

test_no_loop_registers_for_a_person_but_governance if {
	every service in ["learning", "execution"] {
		denied(json.patch(registration_for("olga", ["operator"]), [{"op": "replace", "path": "/actor/service", "value": service}]))
	}
}

versioned_write_for(person, roles, action, kind) := {
	"actor": {"service": "governance"},
	"action": action,
	"resource": {"kind": kind, "attrs": {"name": "holdout"}},
	"context": {"on_behalf_of": {"user": person, "roles": roles}},
}

versioned_writes := [
	["create", "eval_set"], ["create", "eval_item"], ["freeze", "eval_set"],
	["create", "threshold"], ["create", "task_set"],
]

test_learning_sees_no_task_set if {
	not granted_to_service("learning", "task_set", "read")
	denied(svc_clean("learning", "read", "task_set"))
	allowed(svc_clean("execution", "read", "task_set"))
	denied(svc_clean("execution", "create", "task_set"))
}

test_governance_freezes_eval_sets_and_sets_thresholds_for_an_operator if {
	every pair in versioned_writes {
		allowed(versioned_write_for("olga", ["operator"], pair[0], pair[1]))
		allowed(person_clean("olga", ["operator"], pair[0], pair[1]))
	}
}

test_no_one_else_freezes_eval_sets_or_sets_thresholds if {
	every pair in versioned_writes {
		every roles in [["ml_engineer"], ["auditor"], ["admin"]] {
			denied(versioned_write_for("maya", roles, pair[0], pair[1]))
			denied(person_clean("maya", roles, pair[0], pair[1]))
		}
	}
}

test_operators_never_change_a_version_in_place if {
	every kind in ["eval_set", "eval_item", "threshold", "environment_version"] {
		every action in ["update", "delete"] {
			denied(person_clean("olga", ["operator"], action, kind))
			denied(versioned_write_for("olga", ["operator"], action, kind))
		}
	}
}

test_ml_engineers_and_operators_import_models if {
	allowed(person_clean("uma", ["ml_engineer"], "import", "checkpoint"))
	allowed(person_clean("olga", ["operator"], "import", "checkpoint"))
	denied(person_clean("ada", ["auditor"], "import", "checkpoint"))
	denied(person_clean("adam", ["admin"], "import", "checkpoint"))
	denied(person_clean("nobody", [], "import", "checkpoint"))
}

test_import_applies_to_checkpoints_only if {
	denied(person_clean("uma", ["ml_engineer"], "import", "training_run"))
	denied(svc_clean("learning", "import", "checkpoint"))
}
