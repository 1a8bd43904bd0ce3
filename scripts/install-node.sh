#!/usr/bin/env bash
# Installs what the real node of the test harness (`hami dev cluster up --real-node`, the
# tests in tests/realnode/) runs on, from Debian packages: containerd, runc, the CNI plugins
# (bridge, host-local, loopback, portmap) and iptables. The kubelet itself is built by
# scripts/install-kube.sh; the pause and test images by hami.dev.images.
#
# Idempotent: installs only the missing packages, and runs `apt-get update` only when one of
# them is not known to apt yet. Not root, or not a Debian-like system: says so and exits 0 (the
# real-node tests then skip, naming what is missing).
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables)

log() { printf '[install-node %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    log "not a Debian-like system: install ${PACKAGES[*]} yourself for the real-node tests"
    exit 0
fi

missing=()
for package in "${PACKAGES[@]}"; do
    installed "$package" || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "node packages present: ${PACKAGES[*]}"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    log "not root: cannot install ${missing[*]}; the real-node tests will skip"
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
