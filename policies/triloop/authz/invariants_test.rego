package triloop.authz_test

import data.triloop.authz

# A deliberately broken table that grants every loop everything: the "never"
# rules must still deny.
grant_everything := {service: {kind: authz.actions | some kind in authz.kinds} | some service in authz.loop_services}

denied_despite_grants(inp, fragment) if {
	d := authz.decision with input as inp with authz.service_grants as grant_everything
	d.allow == false
	some reason in d.reasons
	contains(reason, fragment)
}

allowed_with_broken_grants(inp) if {
	d := authz.decision with input as inp with authz.service_grants as grant_everything
	d.allow == true
}

test_broken_table_really_grants if {
	allowed_with_broken_grants(svc_clean("learning", "read", "audit_event"))
}

test_no_loop_may_release_or_judge_a_candidate if {
	every service in ["learning", "execution"] {
		every action in authz.release_actions {
			every kind in authz.applies_to[action] {
				denied_despite_grants(svc_clean(service, action, kind), "a loop cannot release or judge")
			}
		}
	}
}

test_learning_never_writes_what_judges_it if {
	every kind in authz.judging_kinds {
		every action in authz.write_actions {
			denied_despite_grants(svc_clean("learning", action, kind), "cannot touch what judges it")
		}
	}
}

test_learning_never_reads_eval_items if {
	denied_despite_grants(svc_clean("learning", "read", "eval_item"), "never read eval items")
}

test_learning_and_execution_never_change_contracts if {
	every service in ["learning", "execution"] {
		every kind in authz.contract_kinds {
			every action in authz.write_actions {
				denied_despite_grants(svc_clean(service, action, kind), "belong to governance")
			}
		}
	}
}

test_execution_never_writes_judging_or_training_data if {
	every kind in authz.judging_kinds | authz.training_kinds {
		every action in authz.write_actions {
			denied_despite_grants(svc_clean("execution", action, kind), "does not judge or train")
		}
	}
}

test_governance_never_trains if {
	every kind in ["checkpoint", "training_step", "trajectory", "step"] {
		every action in authz.write_actions {
			denied_despite_grants(svc_clean("governance", action, kind), "governance never trains")
		}
	}
}

test_audit_log_is_append_only if {
	every action in authz.write_actions {
		denied_despite_grants(svc_clean("governance", action, "audit_event"), "append-only")
	}
	allowed(person_clean("ada", ["auditor"], "verify", "audit_event"))
}

test_frozen_things_stay_frozen if {
	frozen := {
		"actor": {"service": "governance"},
		"action": "update",
		"resource": {"kind": "eval_set", "id": "es-1", "attrs": {"frozen": true}},
	}
	denied_because(frozen, "eval_set es-1 is frozen and may not be updated")
	denied_because(json.patch(frozen, [{"op": "replace", "path": "/resource/kind", "value": "eval_item"}, {"op": "replace", "path": "/action", "value": "delete"}]), "is frozen")
	allowed(json.patch(frozen, [{"op": "replace", "path": "/action", "value": "read"}]))
	allowed(json.patch(frozen, [{"op": "replace", "path": "/resource/attrs/frozen", "value": false}]))
}

test_a_missing_frozen_fact_denies if {
	open_set := {
		"actor": {"service": "governance"},
		"action": "update",
		"resource": {"kind": "eval_set", "id": "es-2", "attrs": {"frozen": false}},
	}
	allowed(open_set)
	denied_because(json.remove(open_set, ["resource/attrs/frozen"]), "eval_set es-2: the frozen fact is missing")
	denied_because(json.remove(open_set, ["resource/attrs"]), "the frozen fact is missing")
	denied_because(json.patch(open_set, [{"op": "replace", "path": "/resource/attrs/frozen", "value": "no"}]), "the frozen fact is missing")
	every kind in authz.freezable_kinds {
		every action in ["update", "delete"] {
			denied_despite_grants(svc_clean_without_frozen("governance", action, kind), "the frozen fact is missing")
		}
	}

	# Creating or reading needs no such fact.
	allowed(json.patch(open_set, [
		{"op": "replace", "path": "/action", "value": "create"},
		{"op": "remove", "path": "/resource/attrs/frozen"},
	]))
}

svc_clean_without_frozen(service, action, kind) := json.remove(svc_clean(service, action, kind), ["resource/attrs/frozen"])

test_admin_never_approves if {
	inp := person_clean("root", ["admin", "operator"], "approve", "promotion")
	denied_because(inp, "root is an admin; admins manage users and may never approve")
	admin_approves := object.union(authz.role_grants, {"admin": {"promotion": {"approve"}}})
	d := authz.decision with input as inp with authz.role_grants as admin_approves
	d.allow == false
	allowed(person_clean("root", ["admin"], "update", "user"))
}

test_nobody_changes_their_own_user_record if {
	inp := {
		"actor": {"service": "web", "user": "root", "roles": ["admin"]},
		"action": "update",
		"resource": {"kind": "user", "id": "ROOT"},
	}
	denied_because(inp, "root may not update their own user record")
}

trajectory_set(attrs) := {
	"actor": {"service": "execution"},
	"action": "create",
	"resource": {"kind": "trajectory", "id": "b:0", "attrs": object.union(
		{"purpose": "training", "batch_id": "b", "checkpoint_id": "c"},
		attrs,
	)},
}

test_a_listed_set_of_trajectories_is_allowed if {
	authz.decision.allow with input as trajectory_set({
		"trajectory_ids": ["b:0:0", "b:0:1"],
		"statuses": ["completed", "truncated"], "num_steps": [3, 5],
	})
}

test_a_set_of_trajectories_must_list_its_episodes if {
	every attrs in [
		{"trajectory_ids": [], "statuses": [], "num_steps": []},
		{"trajectory_ids": "b:0:0", "statuses": ["completed"], "num_steps": [1]},
		{"trajectory_ids": ["b:0:0", ""], "statuses": ["completed", "completed"], "num_steps": [1, 1]},
		{"trajectory_ids": ["b:0:0", "b:0:1"], "statuses": ["completed"], "num_steps": [1, 1]},
		{"trajectory_ids": ["b:0:0"], "statuses": ["completed"]},
	] {
		d := authz.decision with input as trajectory_set(attrs)
		d.allow == false
		some reason in d.reasons
		contains(reason, "must list every episode")
	}
}
