"""Configuration from ``TRILOOP_*`` environment variables (pydantic-settings).

Every service reads the same settings; each then connects with its own database
role. Defaults describe the embedded one-machine stack under ``.triloop/``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from triloop.secrets import (
    METRICS_TOKEN,
    OWNER_PASSWORD,
    opa_token_name,
    read_secret,
    role_password_name,
    temporal_token_name,
)

ServiceName = Literal["execution", "learning", "governance", "web"]
# The built-in session secret: anyone can read it here, so only the test profile accepts it.
DEV_SESSION_SECRET = "triloop-dev-session-secret-change-me"
SERVICES: tuple[ServiceName, ...] = ("execution", "learning", "governance", "web")
# Every database role a process logs in with: the services, and the verifier, which
# re-judges the episodes the gates count (``verifier/``) and holds no other credential.
DatabaseRoleName = Literal["execution", "learning", "governance", "web", "verifier"]
DATABASE_ROLES: tuple[DatabaseRoleName, ...] = (*SERVICES, "verifier")
LoopName = Literal["execution", "learning", "governance"]
# Each loop has its own Temporal namespace; the web service is not a loop.
LOOPS: tuple[LoopName, ...] = ("execution", "learning", "governance")


class Settings(BaseSettings):
    """All of triloop's configuration; see the README's table."""

    model_config = SettingsConfigDict(env_prefix="TRILOOP_", extra="ignore")

    home: Path = Field(Path(".triloop"), description="State directory of the embedded stack.")
    database_url: str | None = Field(
        None,
        description="Owner URL (runs migrations). Unset: the embedded PostgreSQL on pg_port.",
    )
    database_url_execution: str | None = Field(None, description="URL for triloop_execution.")
    database_url_learning: str | None = Field(None, description="URL for triloop_learning.")
    database_url_governance: str | None = Field(None, description="URL for triloop_governance.")
    database_url_web: str | None = Field(None, description="URL for triloop_web.")
    database_url_verifier: str | None = Field(None, description="URL for triloop_verifier.")
    pg_port: int = Field(55432, description="Port of the embedded PostgreSQL (loopback).")

    temporal_address: str = Field("127.0.0.1:7233", description="Temporal frontend host:port.")
    temporal_namespace_prefix: str = Field(
        "triloop", description="Each loop's Temporal namespace is <prefix>-<loop>.")
    temporal_token: str | None = Field(
        None, description="This service's Temporal token (JWT); default the temporal-<service>"
        " secret. Unset and no secret: connect without one (a server without authorization).")
    temporal_mode: Literal["server", "dev"] = Field(
        "server", description="server: the real Temporal server, JWT authorization on;"
        " dev: the quick-start dev server, which authenticates nobody.")
    temporal_tls_cert: Path | None = Field(None, description="Client certificate (mTLS).")
    temporal_tls_key: Path | None = Field(None, description="Client key (mTLS).")
    temporal_ui_port: int = Field(8233, description="Port of the dev server's web UI (dev mode).")
    temporal_ui_url: str | None = Field(
        None, description="Base URL of a Temporal UI for this cluster, for the console's links "
        "(the real server ships none; dev mode defaults to the dev server's UI).")
    task_queue_prefix: str = Field("", description="Prefix for task queue names (tests).")

    secrets_dir: Path | None = Field(
        None,
        description="Folder of credential files (pg-<service>, opa-<service>, ...);"
        " default home/secrets. `dev up` hands each service a folder of its own.",
    )
    opa_token: str | None = Field(
        None, description="This service's OPA bearer token; default the opa-<service> secret."
    )
    opa_url: str = Field("http://127.0.0.1:8181", description="OPA server base URL.")
    opa_timeout_s: float = Field(2.0, description="Timeout of one policy query, seconds.")

    artifact_dir: Path | None = Field(None, description="Artifact store; default home/artifacts.")
    artifact_url: str | None = Field(
        None,
        description="Shared artifact store for workers on several machines: s3://bucket/prefix"
        " (checkpoints are published there and read by id); unset: artifact_dir only.",
    )
    artifact_s3_endpoint: str | None = Field(
        None, description="S3-compatible endpoint URL of artifact_url (e.g. http://minio:9000)."
    )
    artifact_s3_region: str = Field("us-east-1", description="Region the S3 signature names.")
    artifact_s3_access_key_id: str | None = Field(None, description="S3 access key id.")
    artifact_s3_secret_access_key: str | None = Field(None, description="S3 secret access key.")
    web_host: str = Field("127.0.0.1", description="Web app bind address.")
    web_port: int = Field(8000, description="Web app port.")
    session_secret: str = Field(
        DEV_SESSION_SECRET,
        description="Signs console session cookies; the built-in value is refused unless "
        "gate_profile is test (`triloop dev up` generates one per install).",
    )
    session_max_age_s: int = Field(
        12 * 3600, gt=0, description="Lifetime of a console sign-in, seconds (signed timestamp)."
    )
    api_token_lifetime_s: int = Field(
        90 * 86400, gt=0, description="Lifetime of a newly issued API token, seconds."
    )
    max_body_bytes: int = Field(
        1_048_576, gt=0, description="Largest request body the web service reads, bytes (413)."
    )
    validation_timeout_s: float = Field(
        5.0, gt=0, description="Time limit of one run-config validation off the event loop, s."
    )
    max_production_batches_in_flight: int = Field(
        16, gt=0, description="Production episode batches (POST /api/episodes) that may run at"
        " once; beyond it the API answers 429 with Retry-After (batches)."
    )
    production_retry_after_s: int = Field(
        10, gt=0, description="The Retry-After a 429 for production traffic names, s."
    )
    webhook_poll_s: float = Field(
        2.0, ge=0, description="How often the web service reads the audit log for webhook"
        " events and sends the deliveries due (seconds); 0: this process sends none.")
    webhook_timeout_s: float = Field(
        5.0, gt=0, description="HTTP timeout of one webhook delivery attempt, seconds.")
    webhook_retry_base_s: float = Field(
        10.0, ge=0, description="Wait after a webhook delivery's first failed attempt, seconds;"
        " doubled after each further failure up to webhook_retry_max_s.")
    webhook_retry_max_s: float = Field(
        3600.0, ge=0, description="Longest wait between two attempts of a delivery, seconds.")
    webhook_max_attempts: int = Field(
        8, ge=1, description="Attempts of a webhook delivery before it is given up (count).")

    inference_backend: Literal["torch", "openai"] = Field(
        "torch", description="torch: in-process; openai: a vLLM (OpenAI-compatible) server."
    )
    inference_url: str | None = Field(None, description="Base URL of the OpenAI-compatible server.")
    inference_reload: Literal["lora", "full"] = Field(
        "lora", description="How the openai backend makes the server hold a new checkpoint:"
        " lora: vLLM's runtime LoRA loading (--enable-lora); full: reload the served model's"
        " full weights in place (vLLM dev mode, one checkpoint per server at a time)."
    )
    batch_gather_ms: float = Field(
        15.0, ge=0.0,
        description="How long the in-process batching engine waits for the next request of a"
        " wave before it decodes what it has (milliseconds, per straggler; at most ten waits)."
        " Episodes released together (by a checkpoint's load, a group's start) reach it spread"
        " out on a busy CPU; a split wave costs a whole second decode.")
    torch_threads: int | None = Field(
        None, ge=1,
        description="Intra-op threads of each torch user in a worker: the batching engine's"
        " thread and the learner's thread (count). Unset: torch's default, every core. Each"
        " thread that runs torch gets its own pool, so workers (or the two loops in one"
        " process) sharing a machine oversubscribe it unless their threads add up to its cores.")
    checkpoint_retention: bool = Field(
        True, description="Prune old iterations' checkpoint weights and trainer state (their"
        " lineage rows stay, marked pruned); false: every checkpoint keeps its files forever.")
    checkpoint_keep_last: int = Field(
        3, ge=1, description="Iterations of a run whose checkpoints keep their files when its"
        " RUN.yaml leaves checkpoints.keep_last unset (count). Production, candidates, rollback"
        " targets and bases are kept whatever it says.")
    sandbox: Literal["bubblewrap", "local"] = Field(
        "bubblewrap", description="Where agent code runs. bubblewrap: isolated, and refused"
        " where bubblewrap cannot run (fail closed); local: unisolated, rlimits only, a"
        " development setting that `dev status` and the console show.")
    gate_profile: Literal["production", "demo", "test"] = Field(
        "production", description="Soak and deadline durations: days, minutes or seconds."
    )
    metrics_token: str | None = Field(
        None, description="Bearer token a Prometheus scrape of any service's /metrics must"
        " send; default the metrics-token secret. Unset and no secret: /metrics answers"
        " loopback clients only (triloop/metrics.py).")
    metrics_host: str = Field(
        "127.0.0.1", description="Bind address of each loop worker's /metrics server.")
    metrics_port_execution: int = Field(
        9471, ge=0, le=65535, description="Port of the execution worker's /metrics (0: none).")
    metrics_port_learning: int = Field(
        9472, ge=0, le=65535, description="Port of the learning worker's /metrics (0: none).")
    metrics_port_governance: int = Field(
        9473, ge=0, le=65535, description="Port of the governance worker's /metrics (0: none).")

    @property
    def artifacts(self) -> Path:
        """Where content-addressed artifacts live."""
        return self.artifact_dir or self.home / "artifacts"

    @property
    def artifact_cache(self) -> Path:
        """Where this machine keeps verified copies of checkpoints read from the shared store."""
        return self.home / "artifact-cache"

    @property
    def secrets(self) -> Path:
        """Where this process finds its credential files."""
        return self.secrets_dir or self.home / "secrets"

    def owner_url(self) -> str:
        """URL of the migration owner (superuser on the embedded stack), with its password."""
        if self.database_url:
            return self.database_url
        url = f"postgresql+psycopg://postgres@127.0.0.1:{self.pg_port}/triloop"
        return _with_password(url, read_secret(self.secrets, OWNER_PASSWORD))

    def role_url(self, service: DatabaseRoleName) -> str:
        """URL a service connects with: its own role and password, never the owner's.

        The password is the one in the URL if it has one, else the service's secret file;
        without either the server refuses the connection (no role logs in without one).
        """
        explicit: str | None = getattr(self, f"database_url_{service}")
        url = explicit or _with_user(self.owner_url(), f"triloop_{service}")
        from sqlalchemy.engine import make_url

        if make_url(url).password:
            return url
        return _with_password(url, read_secret(self.secrets, role_password_name(service)))

    def opa_tokens(self, *services: ServiceName) -> dict[str, str]:
        """The OPA bearer tokens this process holds for ``services`` (default: all it has)."""
        tokens: dict[str, str] = {}
        for service in services or SERVICES:
            token = self.opa_token or read_secret(self.secrets, opa_token_name(service))
            if token is not None:
                tokens[service] = token
        return tokens

    def metrics_scrape_token(self) -> str | None:
        """The token a scrape of /metrics must bear, or None: loopback clients only."""
        return self.metrics_token or read_secret(self.secrets, METRICS_TOKEN)

    def metrics_port(self, loop: LoopName) -> int:
        """The port of one loop worker's /metrics server (0: it runs none)."""
        port: int = getattr(self, f"metrics_port_{loop}")
        return port

    def temporal_ui(self) -> str | None:
        """The Temporal UI the console links to: the configured one, else the dev server's."""
        if self.temporal_ui_url:
            return self.temporal_ui_url.rstrip("/")
        if self.temporal_mode == "dev":
            host = self.temporal_address.rsplit(":", 1)[0]
            return f"http://{host}:{self.temporal_ui_port}"
        return None

    def temporal_namespace(self, loop: LoopName) -> str:
        """The namespace of one loop's workflows, task queues and Nexus handlers."""
        return f"{self.temporal_namespace_prefix}-{loop}"

    def temporal_credential(self, holder: str) -> str | None:
        """The Temporal token this process holds for ``holder`` (a service, or admin)."""
        return self.temporal_token or read_secret(self.secrets, temporal_token_name(holder))

    def task_queue(self, name: str) -> str:
        """Task queue name, prefixed so parallel test runs never share queues."""
        return f"{self.task_queue_prefix}{name}"


def _with_user(url: str, user: str) -> str:
    from sqlalchemy.engine import make_url

    # URL.set() ignores None, so the owner's password is dropped with _replace.
    bare = make_url(url).set(username=user)._replace(password=None)
    return bare.render_as_string(hide_password=False)


def _with_password(url: str, password: str | None) -> str:
    if password is None:
        return url
    from sqlalchemy.engine import make_url

    return make_url(url).set(password=password).render_as_string(hide_password=False)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings read once per process."""
    return Settings()
