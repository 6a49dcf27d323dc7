package triloop.authz_test

training_request(facts) := {
	"actor": {"service": "execution", "roles": []},
	"action": "serve",
	"resource": {"kind": "nexus_operation", "id": "run_rollouts", "attrs": object.union(
		{"caller": "learning", "purpose": "training", "batch_id": "run-1-abc"},
		facts,
	)},
}

eval_conflict := {
	"task_id": "task-a", "held_task": "task-a", "held_by": "frozen eval set holdout v1",
	"reason": "task task-a is held out (frozen_lake seed 21, in frozen eval set holdout v1)",
}

traffic_conflict := {
	"task_id": "task-b", "held_task": "task-c", "held_by": "production traffic",
	"reason": "task task-b is the same world as held-out task task-c (frozen_lake seed 31, in production traffic)",
}

test_a_training_batch_on_held_out_tasks_only_is_served if {
	allowed(training_request({"held_out_conflicts": [], "task_ids": ["task-z"]}))
}

test_a_training_batch_on_an_eval_or_traffic_task_is_refused if {
	denied_because(training_request({"held_out_conflicts": [eval_conflict]}), "in frozen eval set holdout v1")
	denied_because(training_request({"held_out_conflicts": [traffic_conflict]}), "in production traffic")
	denied_because(training_request({"held_out_conflicts": [eval_conflict, traffic_conflict]}), "training batch run-1-abc may not be served")
}

test_a_missing_held_out_fact_denies if {
	denied_because(training_request({}), "the held-out fact is missing")
	denied_because(training_request({"held_out_conflicts": "none"}), "a missing fact denies")
}

test_other_purposes_need_no_held_out_fact if {
	allowed(serve("execution", "run_rollouts", "governance", "eval"))
}
