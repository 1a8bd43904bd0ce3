#!/usr/bin/env bash
# Installs the browser the UI's browser tests (tests/integration/test_ui_browser.py) drive:
# Debian's `chromium` package, run headless by Playwright for Python (pinned in pyproject.toml's
# test extras) through `executable_path`, so Playwright never downloads a browser of its own.
#
# Idempotent: installs only when missing, `apt-get update` only when apt does not know the
# package yet. Not root, or not a Debian-like system: says so and exits 0 (the browser tests then
# skip with one line naming what is missing).
set -euo pipefail

PACKAGES=(chromium)

log() { printf '[install-browser %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    log "not a Debian-like system: install ${PACKAGES[*]} yourself for the browser tests"
    exit 0
fi
missing=()
for package in "${PACKAGES[@]}"; do
    installed "$package" || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "browser packages present: ${PACKAGES[*]}"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    log "not root: cannot install ${missing[*]}; the browser tests will skip"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt=(apt-get -q -o DPkg::Lock::Timeout=600)
for package in "${missing[@]}"; do
    if ! apt-cache show "$package" >/dev/null 2>&1; then
        log "apt does not know $package yet: apt-get update"
        "${apt[@]}" update
        break
    fi
done
start=$SECONDS
log "installing ${missing[*]}"
"${apt[@]}" install -y --no-install-recommends "${missing[@]}"
log "installed ${missing[*]} in $((SECONDS - start))s"
