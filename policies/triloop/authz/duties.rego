package triloop.authz

# METADATA
# title: separation of duties and ownership
# description: >-
#   Who may decide about whose work. The caller puts the facts in
#   resource.attrs (submitted_by, audited_by, approved_by) and resource.owner,
#   read from PostgreSQL when it asks; a missing fact denies (fail closed).
#   Duties are checked against the person, whether they arrived through the
#   web service or a loop worker acting for them.
# scope: document
attr(name) := v if {
	v := norm(input.resource.attrs[name])
	v != ""
}

# Actions whose separation of duties needs to know who submitted the run.
needs_submitter := {"approve", "sign_audit", "promote"}

deny_reasons contains sprintf(
	"%s needs resource.attrs.submitted_by to check separation of duties",
	[action],
) if {
	action in needs_submitter
	not attr("submitted_by")
}

deny_reasons contains sprintf(
	"separation of duties: %s submitted the run and may not %s its candidate",
	[human.user, action],
) if {
	action in {"approve", "sign_audit"}
	attr("submitted_by") == human.user
}

deny_reasons contains "approve needs a signed audit first: resource.attrs.audited_by is missing" if {
	action == "approve"
	not attr("audited_by")
}

deny_reasons contains sprintf(
	"separation of duties: %s signed the audit and may not also approve",
	[human.user],
) if {
	action == "approve"
	attr("audited_by") == human.user
}

# Promotion is the governance loop's own act, so the policy itself checks that
# the promotion record carries an audit and an approval by two other people.
deny_reasons contains sprintf("promote needs resource.attrs.%s", [name]) if {
	action == "promote"
	some name in ["audited_by", "approved_by"]
	not attr(name)
}

deny_reasons contains "separation of duties: the audit and the approval were given by the same person" if {
	action == "promote"
	attr("audited_by") == attr("approved_by")
}

deny_reasons contains sprintf("separation of duties: the submitter %s also %s the candidate", [
	attr("submitted_by"),
	verb,
]) if {
	action == "promote"
	some field, verb in {"audited_by": "audited", "approved_by": "approved"}
	attr(field) == attr("submitted_by")
}

# People act on their own training runs only; the learning loop pausing its own
# run (stability monitor) has no person and is not an owner question.
owner_actions := {"submit", "cancel", "pause", "resume"}

resource_owner := v if {
	v := norm(input.resource.owner)
	v != ""
}

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
