package triloop.authz

# METADATA
# title: webhooks are an operator's configuration
# description: >-
#   A webhook sends what happens in the loops (promotions waiting for a person,
#   failed gates, rollbacks, alarms, runs ending) to a URL, signed with a secret
#   it holds. Operators make and disable them and operators and auditors read
#   them (grants.rego), all through the web service that proves who the person
#   is. No loop touches one: a loop that could point the notifications
#   elsewhere could hide from the people who watch it. The web service sends
#   the deliveries itself, from the audit log, and audits each attempt.
# scope: document
webhook_writes := {"create", "delete"}

deny_reasons contains sprintf(
	"%s may not %s webhook: webhooks are configured by an operator through the web service",
	[who, action],
) if {
	kind == "webhook"
	mode != "human"
}
