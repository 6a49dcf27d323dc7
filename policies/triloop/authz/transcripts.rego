package triloop.authz

# METADATA
# title: who reads which transcripts
# description: >-
#   A person reads an episode's transcript (its turns, tokens and verdict) through
#   the web service. Eval, shadow, canary and production episodes are what the
#   gates judge a candidate on: auditors and operators read them. Training
#   episodes are the ML engineer's own work: the engineer who submitted the run
#   reads them (and auditors, who may read every kind). The web service puts the
#   episode's purpose (and, for training, the run's submitter) in
#   resource.attrs, read from PostgreSQL; a missing fact denies (fail closed).
#   The loops keep their own grants (grants.rego); the learning role is also kept
#   off judged episodes by row-level security (migration 0011).
# scope: document
judged_purposes := {"eval", "shadow", "canary", "production"}

transcript_purposes := judged_purposes | {"training"}

judged_transcript_readers := {"auditor", "operator"}

reading_transcript if {
	mode == "human"
	kind == "trajectory"
	action == "read"
}

deny_reasons contains "reading a transcript needs resource.attrs.purpose (training, eval, shadow, canary or production)" if {
	reading_transcript
	not known_transcript_purpose
}

known_transcript_purpose if attrs.purpose in transcript_purposes

deny_reasons contains sprintf(
	"transcripts of %s episodes are read by auditors and operators only; %s holds %s",
	[attrs.purpose, human.user, roles_text],
) if {
	reading_transcript
	attrs.purpose in judged_purposes
	count(human.roles & judged_transcript_readers) == 0
}

deny_reasons contains "reading a training transcript needs resource.attrs.submitted_by (the run's submitter)" if {
	reading_transcript
	attrs.purpose == "training"
	not attrs.submitted_by
	not "auditor" in human.roles
}

deny_reasons contains sprintf(
	"training transcripts are read by the ML engineer who submitted the run (%s) and by auditors; %s holds %s",
	[attrs.submitted_by, human.user, roles_text],
) if {
	reading_transcript
	attrs.purpose == "training"
	not "auditor" in human.roles
	not own_run_engineer
}

own_run_engineer if {
	"ml_engineer" in human.roles
	attrs.submitted_by == human.user
}

roles_text := "no role" if count(human.roles) == 0

roles_text := sprintf("roles %s", [concat(", ", sort(human.roles))]) if count(human.roles) > 0
