package triloop.authz

# METADATA
# title: separation of duties and ownership
# description: >-
#   Who may decide about whose work. The caller puts the facts in
#   resource.attrs (submitted_by, audited_by, approved_by) and resource.owner,
#   read from PostgreSQL when it asks; a missing fact denies (fail closed).
#   Duties are checked against the person, whether they arrived through the
#   web service or a loop worker acting for them.
#   needs_submitter lists the actions whose duty check needs the submitter.
# scope: document
needs_submitter := {"approve", "sign_audit", "promote", "override_alarms"}

deny_reasons contains sprintf(
	"%s needs resource.attrs.submitted_by to check separation of duties",
	[action],
) if {
	action in needs_submitter
	not attrs.submitted_by
}

deny_reasons contains sprintf(
	"separation of duties: %s submitted the run and may not %s its candidate",
	[human.user, action],
) if {
	action in {"approve", "sign_audit", "override_alarms"}
	attrs.submitted_by == human.user
}

deny_reasons contains "approve needs a signed audit first: resource.attrs.audited_by is missing" if {
	action == "approve"
	not attrs.audited_by
}

deny_reasons contains sprintf(
	"separation of duties: %s signed the audit and may not also approve",
	[human.user],
) if {
	action == "approve"
	attrs.audited_by == human.user
}

# Promotion is the governance loop's own act, so the policy itself checks that
# the promotion record carries an audit and an approval by two other people.
deny_reasons contains sprintf("promote needs resource.attrs.%s", [name]) if {
	action == "promote"
	some name in ["audited_by", "approved_by"]
	not attrs[name]
}

deny_reasons contains "separation of duties: the audit and the approval were given by the same person" if {
	action == "promote"
	attrs.audited_by == attrs.approved_by
}

deny_reasons contains sprintf("separation of duties: the submitter %s also %s the candidate", [
	attrs.submitted_by,
	verb,
]) if {
	action == "promote"
	some field, verb in {"audited_by": "audited", "approved_by": "approved"}
	attrs[field] == attrs.submitted_by
}

# People act on their own training runs only; the learning loop pausing its own
# run (stability monitor) has no person and is not an owner question.
owner_actions := {"submit", "cancel", "pause", "resume"}

deny_reasons contains sprintf("%s on a training run needs resource.owner", [action]) if {
	action in owner_actions
	human.user
	not resource_owner
}

deny_reasons contains sprintf("%s may %s only their own runs; this run belongs to %s", [
	human.user, action,
	resource_owner,
]) if {
	action in owner_actions
	resource_owner != human.user
}

# Two-person role grants: the admin who requested a privileged role for someone
# may not also decide it. requested_by is read from the role_grant row.
grant_decisions := {"confirm", "refuse"}

deny_reasons contains sprintf("%s a role grant needs resource.attrs.requested_by", [action]) if {
	kind == "role_grant"
	action in grant_decisions
	not attrs.requested_by
}

deny_reasons contains sprintf(
	"two-person rule: %s requested this role grant and may not %s it; another admin must",
	[human.user, action],
) if {
	kind == "role_grant"
	action in grant_decisions
	attrs.requested_by == human.user
}

# A person may sign an audit, approve or override alarms only with a role held since before the
# promotion opened: a role granted once the candidate is on its way cannot be
# the one that lets it through. Governance reads both facts from PostgreSQL:
# resource.attrs.promotion_opened_at (the promotion row) and
# context.on_behalf_of.role_since (the confirmed role grant). A missing or
# unparsable fact denies.
role_age_actions := {"approve", "sign_audit", "override_alarms"}

promotion_opened_ns := time.parse_rfc3339_ns(input.resource.attrs.promotion_opened_at)

role_since_ns := time.parse_rfc3339_ns(input.context.on_behalf_of.role_since)

deny_reasons contains sprintf(
	"%s needs resource.attrs.promotion_opened_at (RFC 3339) to check the role's age",
	[action],
) if {
	mode == "delegated"
	action in role_age_actions
	not promotion_opened_ns
}

deny_reasons contains sprintf(
	"%s needs context.on_behalf_of.role_since (RFC 3339) to check the role's age",
	[action],
) if {
	mode == "delegated"
	action in role_age_actions
	not role_since_ns
}

deny_reasons contains sprintf(
	"%s's role became active at %s, after the promotion opened at %s; %s needs a role held since before",
	[human.user, input.context.on_behalf_of.role_since, input.resource.attrs.promotion_opened_at, action],
) if {
	mode == "delegated"
	action in role_age_actions
	role_since_ns > promotion_opened_ns
}
