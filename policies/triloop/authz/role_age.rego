package triloop.authz

# METADATA
# title: the web service asks the role-age question too
# description: >-
#   A role must predate the promotion it decides on (duties.rego checks it,
#   failing closed, when governance carries a decision out for the person). The
#   web service asks the same question first, with the same two facts read from
#   PostgreSQL: resource.attrs.promotion_opened_at (the promotion row) and
#   resource.attrs.role_since (when the person's role for this decision became
#   active: its confirmed grant, else the person's creation). So the console
#   offers only the decisions governance will accept, and the API refuses the
#   others before anything reaches Temporal. The web service sends both facts on
#   every decision it asks about; without them this early check has nothing to
#   compare, and governance's check still decides.
# scope: document
role_age_role := "auditor" if action == "sign_audit"

default role_age_role := "operator"

# What the decision does, in words, for the reason a person reads.
role_age_act := {"approve": "approve it", "sign_audit": "sign its audit", "override_alarms": "override its alarms"}

deny_reasons contains sprintf(
	"%s's %s role became active at %s, after this promotion opened at %s: a role must predate the promotion it decides on, so another %s whose role does must %s",
	[human.user, role_age_role, input.resource.attrs.role_since, input.resource.attrs.promotion_opened_at, role_age_role, role_age_act[action]],
) if {
	mode == "human"
	action in role_age_actions
	time.parse_rfc3339_ns(input.resource.attrs.role_since) > time.parse_rfc3339_ns(input.resource.attrs.promotion_opened_at)
}
