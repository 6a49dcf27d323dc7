#!/usr/bin/env bash
# Refresh the vendored uPlot (the console's chart library) from its npm package.
#
# Run by a person at build time, never by the app: the console serves the files
# committed under web/console/static/vendor/uplot/ and fetches nothing at run time.
# The version is pinned and each file's sha256 is checked, so a refresh that changes
# a byte fails until this script's pins are updated on purpose.
set -euo pipefail
version="1.6.32"
declare -A pinned=(
  [LICENSE]=8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd
  [uPlot.iife.min.js]=19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f
  [uPlot.min.css]=df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04
)
root="$(cd "$(dirname "$0")/.." && pwd)"
target="$root/web/console/static/vendor/uplot"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$version" >/dev/null && tar xzf "uplot-$version.tgz")
mkdir -p "$target"
cp "$work/package/LICENSE" "$work/package/dist/uPlot.iife.min.js" \
   "$work/package/dist/uPlot.min.css" "$target/"
for name in "${!pinned[@]}"; do
  got="$(sha256sum "$target/$name" | cut -d' ' -f1)"
  if [[ "$got" != "${pinned[$name]}" ]]; then
    echo "vendor_uplot: $name has sha256 $got, pinned ${pinned[$name]}" >&2
    exit 1
  fi
done
echo "uPlot $version vendored in ${target#"$root"/}"
