#!/usr/bin/env bash
# Installs what the real node of the test harness (`hami-dev cluster up --real-node`, the
# tests in tests/realnode/) runs on, from Debian packages: runc, the CNI plugins (bridge,
# host-local, loopback, portmap), iptables, and strace (tests/native/test_region_lock.py). The kubelet and containerd (1.7, for its CDI
# support; Debian 12 ships 1.6) are built by scripts/install-kube.sh; the pause and test images
# by hami_devkit.images.
#
# Idempotent: installs only the missing packages, and runs `apt-get update` only when one of
# them is not known to apt yet. Not root, or not a Debian-like system: says so and exits 0 (the
# real-node tests then skip, naming what is missing).
set -euo pipefail

exec "$(dirname "$0")/apt-install.sh" install-node "the real-node tests" runc containernetworking-plugins iptables strace
