# METADATA
# title: Who may query this OPA server
# description: >-
#   OPA's own authorization (opa run --authentication=token --authorization=basic).
#   Every service holds its own bearer token; data.system.tokens maps the sha256 of
#   each token to the one service it stands for (written by `triloop dev up` from
#   the generated secrets, never in this repository). A query is allowed only when
#   it asks for the triloop decision and the actor it describes is the token's own
#   service (spelled as the decision policy normalises it), so a loop cannot ask as
#   another loop. Everything else (reading data,
#   policies, other paths, no token) is refused, except the liveness probe.
package system.authz

default allow := false

# Liveness probes carry no token and learn nothing.
allow if {
	input.method == "GET"
	input.path == ["health"]
}

allow if {
	input.method == "POST"
	input.path == ["v1", "data", "triloop", "authz", "decision"]
	lower(trim_space(input.body.input.actor.service)) == token_service
}

# The service the bearer token stands for; undefined for no token or an unknown one.
token_service := data.system.tokens[crypto.sha256(input.identity)]
