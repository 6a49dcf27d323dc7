package triloop.authz

# METADATA
# title: calls between loops
# description: >-
#   Loops reach each other only through Nexus operations. The serving loop asks
#   here, with its own token, whether the calling loop may ask it for this: the
#   caller is the namespace the Temporal server named in the request's link, and
#   purpose says what the work is for (training, eval, ...). Learning may ask
#   for training rollouts and hand over proposals; only governance may ask for
#   the batches that decide a promotion or an admission.
# scope: document
nexus_callers := {
	"execution": {
		"run_rollouts": {
			"learning": {"training"},
			"governance": {"eval", "shadow", "canary", "probe"},
		},
		"probe_admission": {"governance": {"admission"}},
		"describe_tasks": {"governance": {"registration"}},
	},
	"governance": {"propose_candidate": {"learning": {"proposal"}}},
}

grant_reasons contains sprintf("%s may ask %s to %s for %s", [
	attrs.caller, service, resource_id,
	attrs.purpose,
]) if {
	mode == "service"
	action == "serve"
	kind == "nexus_operation"
	attrs.purpose in nexus_callers[service][resource_id][attrs.caller]
}
