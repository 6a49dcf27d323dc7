package system.authz_test

import data.system.authz

tokens := {crypto.sha256("learning-token"): "learning", crypto.sha256("web-token"): "web"}

query(token, service) := {
	"method": "POST",
	"path": ["v1", "data", "triloop", "authz", "decision"],
	"identity": token,
	"body": {"input": {"actor": {"service": service}, "action": "read"}},
}

test_a_service_asks_about_itself if {
	authz.allow with input as query("learning-token", "learning") with data.system.tokens as tokens
}

test_a_token_cannot_claim_another_service if {
	not authz.allow with input as query("learning-token", "governance") with data.system.tokens as tokens
}

test_spelling_is_not_a_way_around if {
	authz.allow with input as query("learning-token", " Learning ") with data.system.tokens as tokens
	not authz.allow with input as query("learning-token", "Governance ") with data.system.tokens as tokens
}

test_no_token_is_refused if {
	request := object.remove(query("learning-token", "learning"), ["identity"])
	not authz.allow with input as request with data.system.tokens as tokens
}

test_an_unknown_token_is_refused if {
	not authz.allow with input as query("made-up", "learning") with data.system.tokens as tokens
}

test_reading_data_or_policies_is_refused if {
	not authz.allow with input as {"method": "GET", "path": ["v1", "data", "system", "tokens"], "identity": "web-token"}
		with data.system.tokens as tokens
	not authz.allow with input as {"method": "GET", "path": ["v1", "policies"], "identity": "web-token"}
		with data.system.tokens as tokens
}

test_another_decision_path_is_refused if {
	request := object.union(query("web-token", "web"), {"path": ["v1", "data", "triloop"]})
	not authz.allow with input as request with data.system.tokens as tokens
}

test_health_needs_no_token if {
	authz.allow with input as {"method": "GET", "path": ["health"]}
}
