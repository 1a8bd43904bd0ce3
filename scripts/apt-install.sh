#!/usr/bin/env bash
# Installs Debian packages for a group of tests, idempotently: only the missing ones, and
# `apt-get update` only when apt does not know one of them yet. Not root, or not a Debian-like
# system: says so and exits 0 (those tests then skip, naming what is missing).
#
#   scripts/apt-install.sh TAG WHAT PACKAGE...
#
# TAG prefixes the log lines ([TAG hh:mm:ss]); WHAT names the tests ("the real-node tests").
# Used by scripts/install-node.sh and scripts/install-browser.sh.
set -euo pipefail

tag=$1 what=$2
shift 2
packages=("$@")

log() { printf '[%s %s] %s\n' "$tag" "$(date +%H:%M:%S)" "$*"; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    log "not a Debian-like system: install ${packages[*]} yourself for $what"
    exit 0
fi

missing=()
for package in "${packages[@]}"; do
    installed "$package" || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "packages present: ${packages[*]}"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    log "not root: cannot install ${missing[*]}; $what will skip"
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
