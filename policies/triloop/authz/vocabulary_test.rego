package triloop.authz_test

import data.triloop.authz

# vocabulary.rego: the closed sets, and the input checks that name what is wrong.

test_every_domain_action_is_in_the_vocabulary if {
	every action, kinds in authz.applies_to {
		action in authz.actions
		every kind in kinds {
			kind in authz.kinds
		}
	}
}

test_loops_are_services if {
	authz.loop_services == authz.services - {"web"}
}

test_write_actions_leave_out_looking if {
	not "read" in authz.write_actions
	not "verify" in authz.write_actions
	"promote" in authz.write_actions
}

test_a_domain_action_on_another_kind_is_named if {
	denied_because(svc("governance", "promote", "task"), "action promote does not apply to kind task")
}

test_every_kind_in_the_vocabulary_is_known if {
	every kind in authz.kinds {
		not denied_because(svc("governance", "read", kind), "unknown resource kind")
	}
}

test_a_user_named_by_a_loop_is_refused if {
	inp := json.patch(svc("learning", "read", "task"), [{"op": "add", "path": "/actor/user", "value": "sam"}])
	denied_because(inp, "service learning may not name a user in actor.user")
}

test_on_behalf_of_without_a_user_is_refused if {
	inp := object.union(svc("governance", "admit", "task"), {"context": {"on_behalf_of": {"roles": ["operator"]}}})
	denied_because(inp, "context.on_behalf_of must be an object")
}
