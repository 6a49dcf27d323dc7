package triloop.authz_test

import data.triloop.authz

webhook_input(actor, action) := {
	"actor": actor,
	"action": action,
	"resource": {"kind": "webhook", "id": "wh-1", "attrs": {"url": "https://hooks.example/t"}},
}

opal := {"service": "web", "user": "opal", "roles": ["operator"]}

test_an_operator_makes_reads_and_disables_webhooks if {
	every action in authz.webhook_writes | {"read"} {
		allowed(webhook_input(opal, action))
	}
}

test_an_auditor_reads_webhooks_and_changes_none if {
	ann := {"service": "web", "user": "ann", "roles": ["auditor"]}
	allowed(webhook_input(ann, "read"))
	every action in authz.webhook_writes {
		denied_because(webhook_input(ann, action), "no rule lets user ann")
	}
}

test_engineers_and_admins_neither_read_nor_change_webhooks if {
	every role in {"ml_engineer", "admin"} {
		denied_because(
			webhook_input({"service": "web", "user": "uma", "roles": [role]}, "read"),
			"no rule lets user uma",
		)
		denied_because(webhook_input({"service": "web", "user": "uma", "roles": [role]}, "create"), "no rule lets user uma")
	}
}

test_no_loop_touches_webhooks_even_with_every_grant if {
	every service in authz.loop_services {
		every action in authz.webhook_writes | {"read"} {
			denied_despite_grants(webhook_input({"service": service}, action), "configured by an operator through the web service")
		}
	}
}

test_no_loop_makes_a_webhook_for_an_operator if {
	inp := object.union(webhook_input({"service": "governance"}, "create"), {"context": {"on_behalf_of": {"user": "opal", "roles": ["operator"]}}})
	denied_because(inp, "governance acting for opal (roles: operator) may not create webhook")
}
