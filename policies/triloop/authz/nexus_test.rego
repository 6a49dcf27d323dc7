package triloop.authz_test

serve(server, operation, caller, purpose) := {
	"actor": {"service": server, "roles": []},
	"action": "serve",
	"resource": {"kind": "nexus_operation", "id": operation, "attrs": {"caller": caller, "purpose": purpose}},
}

test_learning_asks_execution_for_training_rollouts if {
	request := serve("execution", "run_rollouts", "learning", "training")
	allowed(json.patch(request, [{"op": "add", "path": "/resource/attrs/held_out_conflicts", "value": []}]))
}

test_governance_asks_execution_for_gate_batches if {
	every purpose in {"eval", "shadow", "canary", "probe"} {
		allowed(serve("execution", "run_rollouts", "governance", purpose))
	}
	allowed(serve("execution", "probe_admission", "governance", "admission"))
	allowed(serve("execution", "describe_tasks", "governance", "registration"))
}

test_only_governance_asks_for_task_descriptions if {
	every caller in {"learning", "web", "unknown"} {
		denied_because(serve("execution", "describe_tasks", caller, "registration"), "no rule lets")
	}
	denied_because(serve("execution", "describe_tasks", "governance", "training"), "no rule lets")
}

test_learning_may_not_ask_for_the_batches_that_decide_a_promotion if {
	every purpose in {"eval", "shadow", "canary", "probe"} {
		denied_because(serve("execution", "run_rollouts", "learning", purpose), "no rule lets service execution serve")
	}
	denied_because(serve("execution", "probe_admission", "learning", "admission"), "no rule lets")
}

test_only_learning_hands_over_proposals if {
	allowed(serve("governance", "propose_candidate", "learning", "proposal"))
	every caller in {"execution", "governance", "web", "unknown"} {
		denied_because(serve("governance", "propose_candidate", caller, "proposal"), "no rule lets")
	}
}

test_a_loop_serves_only_its_own_operations if {
	denied_because(serve("learning", "run_rollouts", "learning", "training"), "no rule lets")
	denied_because(serve("governance", "run_rollouts", "governance", "eval"), "no rule lets")
	denied_because(serve("execution", "propose_candidate", "learning", "proposal"), "no rule lets")
}

test_an_unknown_caller_is_refused if {
	denied_because(serve("execution", "run_rollouts", "unknown", "training"), "no rule lets")
	denied_because(serve("execution", "run_rollouts", "", "training"), "no rule lets")
}
