package triloop.authz

# METADATA
# title: training stays off held-out tasks
# description: >-
#   Execution serves a training batch only when none of its tasks is held out:
#   a task of a frozen eval set, or of production traffic, or the same world
#   (environment and seed) as one. The handler reads the conflicts from
#   PostgreSQL and sends them as resource.attrs.held_out_conflicts, one
#   {task_id, held_task, held_by, reason} each; a missing list denies.
# scope: document
deny_reasons contains sprintf(
	"training batch %v may not be served: %v; training stays off eval and production-traffic tasks",
	[object.get(input.resource.attrs, "batch_id", ""), conflict.reason],
) if {
	training_batch_request
	some conflict in input.resource.attrs.held_out_conflicts
}

deny_reasons contains concat("", [
	"training batch request: the held-out fact is missing ",
	"(resource.attrs.held_out_conflicts must be a list) and a missing fact denies",
]) if {
	training_batch_request
	not is_array(object.get(input.resource.attrs, "held_out_conflicts", null))
}

training_batch_request if {
	action == "serve"
	kind == "nexus_operation"
	resource_id == "run_rollouts"
	attrs.purpose == "training"
}
