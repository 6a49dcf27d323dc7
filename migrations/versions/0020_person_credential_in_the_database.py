"""A person's credential is checked inside the database; the audit log appends in one call.

Issue 32, routes 4 and 8. The web role could insert any person's ``human_decision``, update
``app_user.roles`` past the two-person grant, and mint API tokens for anyone; any role could
hold the audit chain head, choose a row's hash, or name a person as the actor.

- ``triloop_person_of(secret)`` hashes a raw secret (an API token, or a console session's
  secret) inside the database and returns the enabled person whose live row it matches.
  No role may call it directly; the SECURITY DEFINER functions below do.
- ``console_session``: one row per console sign-in, holding only the sha256 of a secret
  that ``triloop_sign_in(token, ...)`` generates inside the database after it checked the
  person's API token. The web role may read the table, never write it.
- Writes that speak for a person take the raw secret of this request and stamp the person
  from it: ``triloop_record_decision`` (the web role loses INSERT on ``human_decision``),
  ``triloop_issue_token`` (loses INSERT on ``api_token``: a person issues their own, an
  admin only the first token of a person who has none), ``triloop_request_role_grant`` and
  ``triloop_decide_role_grant`` (loses INSERT/UPDATE on ``role_grant`` and UPDATE of
  ``app_user.roles``; a web-role insert of a user with a privileged role is refused).
- ``decision_use``: a decision is carried out once. The loop that proves a decision writes
  its row (keyed by the decision id) naming the activity execution that used it.
- ``triloop_audit_log(...)`` replaces ``triloop_audit_head``/``triloop_audit_append``: it
  takes the head, computes the hash from the row as PostgreSQL stores it, and appends, in
  one call. A service role's row must name its own service and no person; the web role may
  name a person only with that person's secret. A transaction that sits on the head past
  ``lock_timeout`` while another waits is ended, and a wait that still fails raises
  ``lock_not_available`` saying so.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("triloop_execution", "triloop_learning", "triloop_governance", "triloop_web")
ROLE_LIST = ", ".join(f"'{role}'" for role in ROLES)
LOCK_TIMEOUT = "5s"
PRIVILEGED = "ARRAY['operator', 'auditor', 'admin']"
DEFINER = "LANGUAGE plpgsql SECURITY DEFINER SET search_path = public"

CREDENTIALS = f"""
CREATE TABLE console_session (
    id text PRIMARY KEY,
    user_name text NOT NULL REFERENCES app_user (name),
    token_id text NOT NULL REFERENCES api_token (id),
    secret_hash text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    ended_at timestamptz
);
CREATE INDEX ix_console_session_user_name ON console_session (user_name);
REVOKE ALL ON console_session FROM PUBLIC;

CREATE OR REPLACE FUNCTION triloop_secret_digest(p_secret text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT encode(sha256(convert_to(p_secret, 'UTF8')), 'hex') $$;

CREATE OR REPLACE FUNCTION triloop_new_secret() RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '')
$$;

-- The enabled person whose live API token or console session this raw secret is.
CREATE OR REPLACE FUNCTION triloop_person_of(p_secret text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = public AS $$
DECLARE
    digest text;
    who text;
BEGIN
    IF p_secret IS NULL OR p_secret = '' THEN
        RAISE EXCEPTION 'no credential was presented: a person''s action needs the API token'
            ' or console session of this request' USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    digest := triloop_secret_digest(p_secret);
    SELECT t.user_name INTO who FROM api_token t JOIN app_user u ON u.name = t.user_name
        WHERE t.token_hash = digest AND t.revoked_at IS NULL AND t.expires_at > now()
          AND NOT u.disabled;
    IF who IS NULL THEN
        SELECT s.user_name INTO who FROM console_session s
            JOIN api_token t ON t.id = s.token_id AND t.user_name = s.user_name
            JOIN app_user u ON u.name = s.user_name
            WHERE s.secret_hash = digest AND s.ended_at IS NULL AND s.expires_at > now()
              AND t.revoked_at IS NULL AND t.expires_at > now() AND NOT u.disabled;
    END IF;
    IF who IS NULL THEN
        RAISE EXCEPTION 'the credential presented is not a live API token or console session'
            ' of an enabled person' USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN who;
END;
$$;
REVOKE ALL ON FUNCTION triloop_person_of(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION triloop_new_secret() FROM PUBLIC;

CREATE OR REPLACE FUNCTION triloop_holds_role(p_user text, p_role text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = public AS $$
    SELECT EXISTS (SELECT 1 FROM app_user WHERE name = p_user AND p_role = ANY(roles))
$$;
REVOKE ALL ON FUNCTION triloop_holds_role(text, text) FROM PUBLIC;

-- Sign-in: the person's API token, checked here; the session's secret is made here too,
-- so the web service can hold a session only for a person who presented their token.
CREATE OR REPLACE FUNCTION triloop_sign_in(
    p_token text, p_lifetime_s integer,
    OUT session_id text, OUT user_name text, OUT token_id text, OUT secret text
) {DEFINER} AS $$
#variable_conflict use_variable
BEGIN
    SELECT t.id, t.user_name INTO token_id, user_name
        FROM api_token t JOIN app_user u ON u.name = t.user_name
        WHERE t.token_hash = triloop_secret_digest(p_token) AND t.revoked_at IS NULL
          AND t.expires_at > now() AND NOT u.disabled;
    IF token_id IS NULL THEN
        RAISE EXCEPTION 'sign-in refused: the API token is unknown, expired or revoked, or its'
            ' person is disabled' USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    session_id := replace(gen_random_uuid()::text, '-', '');
    secret := 'tls_' || triloop_new_secret();
    INSERT INTO console_session (id, user_name, token_id, secret_hash, expires_at)
        VALUES (session_id, user_name, token_id, triloop_secret_digest(secret),
                now() + make_interval(secs => greatest(p_lifetime_s, 60)));
    UPDATE app_user SET last_seen_at = now() WHERE name = user_name;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_sign_out(p_secret text) RETURNS void {DEFINER} AS $$
BEGIN
    UPDATE console_session SET ended_at = now()
        WHERE secret_hash = triloop_secret_digest(p_secret) AND ended_at IS NULL;
END;
$$;

-- A token for oneself; an admin may issue only the first token of a person who has none
-- (the one shown when they create the person).
CREATE OR REPLACE FUNCTION triloop_issue_token(
    p_credential text, p_user text, p_token_hash text, p_label text, p_lifetime_s integer
) RETURNS text {DEFINER} AS $$
DECLARE
    presenter text := triloop_person_of(p_credential);
    new_id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    IF presenter <> p_user AND (NOT triloop_holds_role(presenter, 'admin')
            OR EXISTS (SELECT 1 FROM api_token WHERE user_name = p_user)) THEN
        RAISE EXCEPTION '% may not issue a token for %: people issue their own; an admin only'
            ' the first token of a new person', presenter, p_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO api_token (id, user_name, token_hash, label, created_by, created_at, expires_at)
        VALUES (new_id, p_user, p_token_hash, coalesce(p_label, ''), presenter, now(),
                now() + make_interval(secs => p_lifetime_s));
    RETURN new_id;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_record_decision(
    p_credential text, p_kind text, p_subject text, p_decision text, p_comment text,
    p_details jsonb
) RETURNS text {DEFINER} AS $$
DECLARE
    person text := triloop_person_of(p_credential);
    new_id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    INSERT INTO human_decision (id, kind, subject, decision, comment, details, user_name,
                                recorded_by)
        VALUES (new_id, p_kind, p_subject, p_decision, coalesce(p_comment, ''),
                coalesce(p_details, '{{}}'::jsonb), person, session_user);
    RETURN new_id;
END;
$$;

-- recorded_by is the role that logged in (inside the function above, current_user is the
-- function's owner).
CREATE OR REPLACE FUNCTION triloop_human_decision_recorded_by() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.recorded_by IS DISTINCT FROM session_user THEN
        RAISE EXCEPTION 'human_decision.recorded_by is the role that logged in (%), not %',
            session_user, NEW.recorded_by USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_request_role_grant(
    p_credential text, p_user text, p_role text
) RETURNS text {DEFINER} AS $$
DECLARE
    requester text := triloop_person_of(p_credential);
    new_id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    IF NOT triloop_holds_role(requester, 'admin') THEN
        RAISE EXCEPTION '% is not an admin; only an admin asks for a role', requester
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO role_grant (id, user_name, role, requested_by)
        VALUES (new_id, p_user, p_role, requester);
    RETURN new_id;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_decide_role_grant(
    p_credential text, p_grant_id text, p_confirm boolean
) RETURNS void {DEFINER} AS $$
DECLARE
    decider text := triloop_person_of(p_credential);
    grant_row role_grant%ROWTYPE;
BEGIN
    IF NOT triloop_holds_role(decider, 'admin') THEN
        RAISE EXCEPTION '% is not an admin; only another admin decides a grant', decider
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO grant_row FROM role_grant WHERE id = p_grant_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role grant % does not exist', p_grant_id
            USING ERRCODE = 'no_data_found';
    END IF;
    -- The CHECK role_grant_two_people and the trigger role_grant_final refuse the rest.
    UPDATE role_grant SET status = CASE WHEN p_confirm THEN 'active' ELSE 'refused' END,
                          confirmed_by = decider, confirmed_at = now()
        WHERE id = p_grant_id;
    IF p_confirm THEN
        UPDATE app_user SET roles = roles || grant_row.role
            WHERE name = grant_row.user_name AND NOT grant_row.role = ANY(roles);
    END IF;
END;
$$;

-- The web role writes people, but never a privileged role: those come from a grant.
CREATE OR REPLACE FUNCTION triloop_app_user_roles() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> 'triloop_web' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.roles && {PRIVILEGED} THEN
        RAISE EXCEPTION 'a new person gets operator, auditor or admin only through a confirmed'
            ' role grant' USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.roles IS DISTINCT FROM OLD.roles THEN
        RAISE EXCEPTION 'app_user.roles changes only through a confirmed role grant'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER app_user_roles_through_grants
    BEFORE INSERT OR UPDATE ON app_user
    FOR EACH ROW EXECUTE FUNCTION triloop_app_user_roles();
"""

DECISION_USE = """
CREATE TABLE decision_use (
    decision_id text PRIMARY KEY REFERENCES human_decision (id),
    used_by text NOT NULL DEFAULT current_user,
    execution text NOT NULL CHECK (execution <> ''),
    used_at timestamptz NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION triloop_decision_use_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'decision_use is append-only: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    NEW.used_by := current_user;
    RETURN NEW;
END;
$$;
CREATE TRIGGER decision_use_stamp
    BEFORE INSERT OR UPDATE OR DELETE ON decision_use
    FOR EACH ROW EXECUTE FUNCTION triloop_decision_use_stamp();
CREATE TRIGGER decision_use_no_truncate
    BEFORE TRUNCATE ON decision_use
    FOR EACH STATEMENT EXECUTE FUNCTION triloop_decision_use_stamp();
REVOKE ALL ON decision_use FROM PUBLIC;
GRANT SELECT, INSERT ON decision_use TO triloop_governance, triloop_learning;
GRANT SELECT ON decision_use TO triloop_web;
"""

AUDIT = f"""
ALTER TABLE audit_event ADD COLUMN hashed_in_db boolean NOT NULL DEFAULT false;

-- The bytes PostgreSQL hashes for a row it appends: jsonb's own text of the stored values,
-- so the writer never serialises (or chooses) what is hashed. Verify reads the same text.
CREATE OR REPLACE FUNCTION triloop_audit_canonical(
    p_seq bigint, p_at timestamptz, p_actor jsonb, p_action text, p_resource jsonb,
    p_decision text, p_decision_id text, p_policy_revision text, p_payload jsonb,
    p_db_role text
) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'seq', p_seq,
        'at', to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'actor', p_actor, 'action', p_action, 'resource', p_resource,
        'decision', p_decision, 'decision_id', p_decision_id,
        'policy_revision', p_policy_revision, 'payload', p_payload, 'db_role', p_db_role)::text
$$;
GRANT EXECUTE ON FUNCTION triloop_audit_canonical(bigint, timestamptz, jsonb, text, jsonb,
    text, text, text, jsonb, text) TO PUBLIC;

-- Who may write this actor: a service role only itself and no person; the web role a
-- person only with that person's secret, and only roles the person holds.
CREATE OR REPLACE FUNCTION triloop_audit_actor_check(p_actor jsonb, p_credential text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path = public AS $$
DECLARE
    service text := p_actor ->> 'service';
    person text := p_actor ->> 'user';
    claimed text[];
BEGIN
    IF session_user NOT IN ({ROLE_LIST}) THEN
        RETURN;  -- the owner (set-up, tests) is not judged here
    END IF;
    IF 'triloop_' || coalesce(service, '') <> session_user THEN
        RAISE EXCEPTION 'database role % writes only its own service''s events, not %',
            session_user, coalesce(service, '(none)') USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF person IS NULL THEN
        RETURN;
    END IF;
    IF session_user <> 'triloop_web' THEN
        RAISE EXCEPTION 'only the web service names a person as the actor; % may not name %',
            session_user, person USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF triloop_person_of(p_credential) IS DISTINCT FROM person THEN
        RAISE EXCEPTION 'the credential of this request is not %''s', person
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    claimed := ARRAY(SELECT jsonb_array_elements_text(coalesce(p_actor -> 'roles', '[]')));
    IF NOT claimed <@ (SELECT roles FROM app_user WHERE name = person) THEN
        RAISE EXCEPTION '% does not hold every role the event names (%)', person, claimed
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION triloop_audit_actor_check(jsonb, text) FROM PUBLIC;

-- A transaction that sat on the chain head past lock_timeout while this one waited: end it.
-- The head's xmax names the holder's transaction, or (when it locked inside a
-- subtransaction, as triloop_audit_log does) one of its subtransactions, whose xid lock is
-- gone once it committed into its parent. Then the holder is the service-role backend in a
-- transaction older than the wait whose top-level xid comes last at or before that xmax.
CREATE OR REPLACE FUNCTION triloop_audit_end_head_holder() RETURNS void
LANGUAGE plpgsql SET search_path = public AS $$
DECLARE
    locker xid := (SELECT xmax FROM audit_chain_head);
    holder integer;
BEGIN
    SELECT l.pid INTO holder FROM pg_locks l
        WHERE l.locktype = 'transactionid' AND l.granted AND l.transactionid = locker
          AND l.pid <> pg_backend_pid();
    IF holder IS NULL THEN
        SELECT a.pid INTO holder FROM pg_stat_activity a
            WHERE a.pid <> pg_backend_pid() AND a.backend_xid IS NOT NULL
              AND a.usename IN ({ROLE_LIST})
              AND a.backend_xid::text::bigint <= locker::text::bigint
              AND a.xact_start <= clock_timestamp() - interval '{LOCK_TIMEOUT}'
            ORDER BY a.backend_xid::text::bigint DESC LIMIT 1;
    END IF;
    IF holder IS NOT NULL THEN
        RAISE WARNING 'ending backend %: it held the audit chain head past lock_timeout',
            holder;
        PERFORM pg_terminate_backend(holder, 5000);
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION triloop_audit_end_head_holder() FROM PUBLIC;

CREATE OR REPLACE FUNCTION triloop_audit_log(
    p_actor jsonb, p_action text, p_resource jsonb, p_decision text, p_decision_id text,
    p_policy_revision text, p_payload jsonb, p_credential text DEFAULT NULL,
    OUT seq bigint, OUT at timestamptz, OUT prev_hash text, OUT hash text,
    OUT db_role text
) {DEFINER} SET lock_timeout = '{LOCK_TIMEOUT}' AS $$
#variable_conflict use_variable
DECLARE
    head audit_chain_head%ROWTYPE;
BEGIN
    IF p_action IS NULL OR p_action = '' OR p_decision IS NULL
            OR p_decision NOT IN ('allow', 'deny', 'record') THEN
        RAISE EXCEPTION 'an audit row needs an action and a decision (allow, deny, record)'
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM triloop_audit_actor_check(p_actor, p_credential);
    db_role := session_user;
    FOR attempt IN 1..2 LOOP
        BEGIN
            -- Lock, hash and insert in one subtransaction: the head's xmax then names it.
            SELECT * INTO head FROM audit_chain_head FOR UPDATE;
            seq := head.seq + 1;
            at := clock_timestamp();
            prev_hash := head.hash;
            hash := encode(sha256(convert_to(head.hash || triloop_audit_canonical(
                seq, at, p_actor, p_action, p_resource, p_decision, p_decision_id,
                p_policy_revision, p_payload, db_role), 'UTF8')), 'hex');
            INSERT INTO audit_event (seq, at, actor, action, resource, decision, decision_id,
                                     policy_revision, payload, prev_hash, hash, db_role,
                                     hashed_in_db)
            VALUES (seq, at, p_actor, p_action, p_resource, p_decision, p_decision_id,
                    p_policy_revision, p_payload, head.hash, hash, db_role, true);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            IF attempt = 2 THEN
                RAISE EXCEPTION 'lock timeout: the audit chain head stayed locked by another'
                    ' transaction for over {LOCK_TIMEOUT} (lock_timeout), twice'
                    USING ERRCODE = 'lock_not_available',
                    HINT = 'pg_stat_activity shows who holds it; the action was not done';
            END IF;
            PERFORM triloop_audit_end_head_holder();
        END;
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION triloop_audit_log(jsonb, text, jsonb, text, text, text, jsonb, text)
    FROM PUBLIC;
DROP FUNCTION triloop_audit_append(bigint, timestamptz, jsonb, text, jsonb, text, text, text,
                                   jsonb, text, text, text);
DROP FUNCTION triloop_audit_head();
"""

# 0006's two-step API, restored on downgrade.
AUDIT_0006 = f"""
CREATE OR REPLACE FUNCTION triloop_audit_head(OUT seq bigint, OUT hash text, OUT db_role text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public SET lock_timeout = '{LOCK_TIMEOUT}'
AS $$
BEGIN
    SELECT h.seq, h.hash INTO seq, hash FROM audit_chain_head h FOR UPDATE;
    db_role := session_user;
END;
$$;

CREATE OR REPLACE FUNCTION triloop_audit_append(
    p_seq bigint, p_at timestamptz, p_actor jsonb, p_action text, p_resource jsonb,
    p_decision text, p_decision_id text, p_policy_revision text, p_payload jsonb,
    p_prev_hash text, p_hash text, p_db_role text
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public SET lock_timeout = '{LOCK_TIMEOUT}'
AS $$
BEGIN
    IF p_db_role IS DISTINCT FROM session_user THEN
        RAISE EXCEPTION 'an audit row states the role that wrote it: %, not %',
            session_user, p_db_role USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_action = '' OR p_decision NOT IN ('allow', 'deny', 'record') THEN
        RAISE EXCEPTION 'an audit row needs an action and a decision (allow, deny, record)'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO audit_event (seq, at, actor, action, resource, decision, decision_id,
                             policy_revision, payload, prev_hash, hash, db_role)
    VALUES (p_seq, p_at, p_actor, p_action, p_resource, p_decision, p_decision_id,
            p_policy_revision, p_payload, p_prev_hash, p_hash, session_user);
END;
$$;
REVOKE ALL ON FUNCTION triloop_audit_head() FROM PUBLIC;
REVOKE ALL ON FUNCTION triloop_audit_append(bigint, timestamptz, jsonb, text, jsonb, text, text,
                                            text, jsonb, text, text, text) FROM PUBLIC;
"""

# 0005's trigger function, restored on downgrade.
RECORDED_BY_0005 = """
CREATE OR REPLACE FUNCTION triloop_human_decision_recorded_by() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.recorded_by IS DISTINCT FROM current_user THEN
        RAISE EXCEPTION 'human_decision.recorded_by is the inserting role (%), not %',
            current_user, NEW.recorded_by USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
"""

WEB_FUNCTIONS = (
    "triloop_sign_in(text, integer)", "triloop_sign_out(text)",
    "triloop_issue_token(text, text, text, text, integer)",
    "triloop_record_decision(text, text, text, text, text, jsonb)",
    "triloop_request_role_grant(text, text, text)",
    "triloop_decide_role_grant(text, text, boolean)",
)
AUDIT_LOG = "triloop_audit_log(jsonb, text, jsonb, text, text, text, jsonb, text)"


def upgrade() -> None:
    op.execute(CREDENTIALS)
    op.execute(DECISION_USE)
    op.execute(AUDIT)
    for function in WEB_FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO triloop_web")
    op.execute("GRANT SELECT ON console_session TO triloop_web")
    # Everything that speaks for a person now goes through the functions above.
    op.execute("REVOKE INSERT ON human_decision FROM triloop_web")
    op.execute("REVOKE INSERT ON api_token FROM triloop_web")
    op.execute("REVOKE INSERT, UPDATE ON role_grant FROM triloop_web")
    op.execute("REVOKE UPDATE ON app_user FROM triloop_web")
    op.execute("GRANT UPDATE (disabled, last_seen_at) ON app_user TO triloop_web")
    for role in ROLES:
        op.execute(f"GRANT EXECUTE ON FUNCTION {AUDIT_LOG} TO {role}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {AUDIT_LOG}")
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_end_head_holder()")
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_actor_check(jsonb, text)")
    op.execute("DROP FUNCTION IF EXISTS triloop_audit_canonical(bigint, timestamptz, jsonb, text,"
               " jsonb, text, text, text, jsonb, text)")
    op.execute(AUDIT_0006)
    for role in ROLES:
        op.execute(f"GRANT EXECUTE ON FUNCTION triloop_audit_head() TO {role}")
        op.execute(f"GRANT EXECUTE ON FUNCTION triloop_audit_append(bigint, timestamptz, jsonb,"
                   f" text, jsonb, text, text, text, jsonb, text, text, text) TO {role}")
    # Rows PostgreSQL hashed stay in the chain; only their marker column goes. Verify at
    # the older revision cannot recompute their hashes (see docs/architecture.md).
    op.execute("ALTER TABLE audit_event DROP COLUMN IF EXISTS hashed_in_db")
    op.execute("DROP TABLE IF EXISTS decision_use")
    op.execute("DROP FUNCTION IF EXISTS triloop_decision_use_stamp()")
    op.execute("DROP TRIGGER IF EXISTS app_user_roles_through_grants ON app_user")
    op.execute("DROP FUNCTION IF EXISTS triloop_app_user_roles()")
    for function in WEB_FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    op.execute(RECORDED_BY_0005)
    op.execute("DROP FUNCTION IF EXISTS triloop_holds_role(text, text)")
    op.execute("DROP FUNCTION IF EXISTS triloop_person_of(text)")
    op.execute("DROP FUNCTION IF EXISTS triloop_new_secret()")
    op.execute("DROP FUNCTION IF EXISTS triloop_secret_digest(text)")
    op.execute("DROP TABLE IF EXISTS console_session")
    op.execute("GRANT INSERT ON human_decision TO triloop_web")
    op.execute("GRANT INSERT ON api_token TO triloop_web")
    op.execute("GRANT INSERT ON role_grant TO triloop_web")
    op.execute("GRANT UPDATE (status, confirmed_by, confirmed_at) ON role_grant TO triloop_web")
    op.execute("GRANT UPDATE ON app_user TO triloop_web")
