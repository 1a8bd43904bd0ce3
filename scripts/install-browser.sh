#!/usr/bin/env bash
# Installs the browser the UI's browser tests (tests/integration/test_ui_browser.py) drive:
# Debian's `chromium` package, run headless by Playwright for Python (pinned in pyproject.toml's
# test extras) through `executable_path`, so Playwright never downloads a browser of its own.
#
# Idempotent: installs only when missing, `apt-get update` only when apt does not know the
# package yet. Not root, or not a Debian-like system: says so and exits 0 (the browser tests then
# skip with one line naming what is missing).
set -euo pipefail

exec "$(dirname "$0")/apt-install.sh" install-browser "the browser tests" chromium
