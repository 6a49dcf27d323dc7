package triloop.authz

# METADATA
# title: serving faults are a person's act
# description: >-
#   Injecting or clearing a serving fault changes how production and canary
#   episodes are served, so it is an operator's game-day decision, made through
#   the web service that proves who the person is. No loop may do it, on its own
#   or for someone (a worker carrying it out would hide who decided). Whatever
#   the table grants, these denials hold.
# scope: document
fault_actions := {"inject_fault", "clear_fault"}

deny_reasons contains sprintf(
	"%s may not %s: serving faults are injected and cleared only by an operator through the web service",
	[who, action],
) if {
	action in fault_actions
	mode != "human"
}
