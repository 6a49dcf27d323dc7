#!/usr/bin/env bash
# Refresh the vendored Swagger UI (what /docs draws the OpenAPI 3.1 document with) from its
# npm package, swagger-ui-dist.
#
# Run by a person at build time, never by the app: the web service serves the files
# committed under web/console/static/vendor/swagger-ui/ and fetches nothing at run time.
# Swagger UI reads OpenAPI 3.1 from 5.0 on (4.x says "Unable to render this definition").
# The version is pinned and each file's sha256 is checked, so a refresh that changes a byte
# fails until this script's pins are updated on purpose.
set -euo pipefail
version="5.35.0"
declare -A pinned=(
  [LICENSE]=cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30
  [NOTICE]=0d20d1adef18aee3f40dd258172155521ce702ac445cb5f7b7d60ed32dad2fb2
  [swagger-ui-bundle.js]=e6a898692f2d768e807c3ba4626068a69a2c5dd960dd6c76f3e4d3a3de180af2
  [swagger-ui-bundle.js.LICENSE.txt]=37eb6e7e59aed57b2c1acf076574b818ea07b74265717e0bd67b59e0baf9abbb
  [swagger-ui.css]=5ed08757e53da3e026d6cbecc61fe5d43585c9560b302d534ad56692519a273d
  [favicon-32x32.png]=3ed612f41e050ca5e7000cad6f1cbe7e7da39f65fca99c02e99e6591056e5837
)
root="$(cd "$(dirname "$0")/.." && pwd)"
target="$root/web/console/static/vendor/swagger-ui"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "swagger-ui-dist@$version" >/dev/null \
  && tar xzf "swagger-ui-dist-$version.tgz")
mkdir -p "$target"
for name in "${!pinned[@]}"; do
  cp "$work/package/$name" "$target/"
  got="$(sha256sum "$target/$name" | cut -d' ' -f1)"
  if [[ "$got" != "${pinned[$name]}" ]]; then
    echo "vendor_swagger_ui: $name has sha256 $got, pinned ${pinned[$name]}" >&2
    exit 1
  fi
done
printf 'Swagger UI %s (Apache-2.0, see LICENSE and NOTICE; the licences of what the bundle\nincludes are in swagger-ui-bundle.js.LICENSE.txt), vendored by scripts/vendor_swagger_ui.sh\nfrom the npm package swagger-ui-dist; served from /static/vendor/swagger-ui/ for /docs.\n' \
  "$version" >"$target/README"
echo "Swagger UI $version vendored in ${target#"$root"/}"
