# METADATA
# title: triloop authorization decision
# description: >-
#   The single entry point, data.triloop.authz.decision, for every privileged
#   action in triloop. Input is normalised here and nowhere else; the decision is
#   an object {allow, reasons} so that a denial always says why.
#   Input: {actor: {service, user?, roles[]}, action,
#   resource: {kind, id?, owner?, attrs?}, context?: {on_behalf_of?: {user, roles[]}}}.
package triloop.authz

# Normalised identifiers: lowercase, surrounding whitespace trimmed. Users and
# attrs that name users go through the same function, so that "Alice " and
# "alice" are one person for separation of duties.
norm(x) := lower(trim_space(x)) if is_string(x)

service := norm(input.actor.service)

action := norm(input.action)

kind := norm(input.resource.kind)

resource_id := norm(input.resource.id)

resource_owner := v if {
	v := norm(input.resource.owner)
	v != ""
}

# Facts for duty checks (submitted_by, audited_by, ...): string values are
# people, normalised like users; empty strings count as missing.
attrs := {name: v |
	some name, raw in input.resource.attrs
	v := norm(raw)
	v != ""
}

# The signed-in user when the web service calls for a person.
actor_user := u if {
	u := norm(input.actor.user)
	u != ""
}

actor_roles := {norm(r) | some r in input.actor.roles}

# The person a loop worker acts for when it executes a human decision.
on_behalf_of_user := u if {
	u := norm(input.context.on_behalf_of.user)
	u != ""
}

on_behalf_of_roles := {norm(r) | some r in input.context.on_behalf_of.roles}

delegating if {
	service in loop_services
	input.context.on_behalf_of
}

# mode says whose grants apply: the loop service's own, a person's through the
# web service, or a person's carried by a loop worker (delegated).
mode := "human" if service == "web"

mode := "delegated" if delegating

mode := "service" if {
	service in loop_services
	not delegating
}

# The person whose roles and duties are checked, whichever way they arrived.
human := {"user": actor_user, "roles": actor_roles} if mode == "human"

human := {"user": on_behalf_of_user, "roles": on_behalf_of_roles} if mode == "delegated"

default allow := false

allow if {
	count(deny_reasons) == 0
	count(grant_reasons) > 0
}

no_grant_reasons contains sprintf("no rule lets %s %s %s", [who, action, kind]) if {
	count(grant_reasons) == 0
}

who := sprintf("service %s", [service]) if mode == "service"

who := sprintf("user %s (roles: %s) via web", [actor_user, concat(",", sort(actor_roles))]) if {
	mode == "human"
}

who := sprintf("%s acting for %s (roles: %s)", [
	service, on_behalf_of_user,
	concat(",", sort(on_behalf_of_roles)),
]) if {
	mode == "delegated"
}

# Fallback so that the denial reason can always be formatted.
default who := "an unidentified caller"

decision := {"allow": true, "reasons": sort(grant_reasons)} if {
	allow
} else := {"allow": false, "reasons": sort(deny_reasons | no_grant_reasons)}
