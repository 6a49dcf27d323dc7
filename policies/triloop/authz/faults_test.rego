package triloop.authz_test

import data.triloop.authz

fault_input(actor, action) := {
	"actor": actor,
	"action": action,
	"resource": {"kind": "serving_fault", "id": "ckpt-1", "attrs": {"temperature": 4}},
}

olga := {"service": "web", "user": "olga", "roles": ["operator"]}

test_an_operator_injects_and_clears_faults if {
	every action in authz.fault_actions {
		allowed(fault_input(olga, action))
	}
}

test_other_roles_may_not_touch_faults if {
	every role in authz.roles - {"operator"} {
		every action in authz.fault_actions {
			denied_because(
				fault_input({"service": "web", "user": "uma", "roles": [role]}, action),
				"no rule lets user uma",
			)
		}
	}
}

test_no_loop_touches_faults_even_with_every_grant if {
	every service in authz.loop_services {
		every action in authz.fault_actions {
			denied_despite_grants(fault_input({"service": service}, action), "only by an operator through the web service")
		}
	}
}

test_no_loop_touches_faults_for_an_operator if {
	inp := object.union(fault_input({"service": "governance"}, "inject_fault"), {"context": {"on_behalf_of": {"user": "olga", "roles": ["operator"]}}})
	denied_because(inp, "governance acting for olga (roles: operator) may not inject_fault")
}

test_fault_actions_apply_only_to_serving_faults if {
	denied_because(
		{"actor": olga, "action": "inject_fault", "resource": {"kind": "checkpoint", "id": "c"}},
		"action inject_fault does not apply to kind checkpoint",
	)
}
