#!/bin/sh
# The web UI's one client library, uPlot (the history charts, docs/ui.md "History"), from the npm
# registry at build time: the version and the registry's integrity hash are pinned here, the
# tarball is checked against the hash before anything is taken from it, and its minified build,
# stylesheet and licence are copied into the Python package (src/hami/ui/static/, git-ignored),
# so the wheel and the image serve them: no CDN at run time.
# Needs npm (any version that has `npm pack`). Run by `make ui-assets`; idempotent.
set -eu
NAME=uplot
VERSION=1.6.32
INTEGRITY=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/src/hami/ui/static"
STAMP="$DEST/uplot.version"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$VERSION $INTEGRITY" ] \
	&& [ -f "$DEST/uplot.iife.min.js" ] && [ -f "$DEST/uplot.min.css" ]; then
	exit 0
fi
command -v npm >/dev/null || { echo "install-ui-assets: npm is needed to fetch $NAME@$VERSION" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$NAME@$VERSION" >/dev/null)
tgz="$tmp/$NAME-$VERSION.tgz"
got="sha512-$(python3 -c 'import base64, hashlib, sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tgz")"
if [ "$got" != "$INTEGRITY" ]; then
	echo "install-ui-assets: $NAME-$VERSION.tgz has integrity $got, expected $INTEGRITY: not installed" >&2
	exit 1
fi
tar -xzf "$tgz" -C "$tmp" package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE
cp "$tmp/package/dist/uPlot.iife.min.js" "$DEST/uplot.iife.min.js"
cp "$tmp/package/dist/uPlot.min.css" "$DEST/uplot.min.css"
cp "$tmp/package/LICENSE" "$DEST/uplot.LICENSE"
echo "$VERSION $INTEGRITY" > "$STAMP"
echo "install-ui-assets: $NAME $VERSION ($(wc -c < "$DEST/uplot.iife.min.js") bytes) in $DEST"
