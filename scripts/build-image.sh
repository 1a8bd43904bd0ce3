#!/bin/sh
# Build the hami image offline (no registry, no container daemon) from the root Containerfile
# and write it as an OCI image archive, importable with `ctr -n k8s.io images import`.
#
#   scripts/build-image.sh            # prints the archive's path on its last line
#
# The recipe is the Containerfile, unchanged. Only its base differs from a user's build: instead
# of python:3.11-slim-bookworm from a registry, a Debian bookworm root filesystem made by
# debootstrap (minbase + python3, python3-venv, ca-certificates) is committed into buildah's
# local storage and passed as the BASE build argument. Packages come from the Debian mirror in
# DEBIAN_MIRROR and Python packages from PyPI, during the build.
#
# Needs root, debootstrap and buildah (apt-get install -y debootstrap buildah). buildah runs
# with chroot isolation, in its own storage under the cache, with the overlay driver (vfs when
# HAMI_BUILDAH_DRIVER=vfs, e.g. where the cache itself is on overlayfs; vfs copies the whole
# root filesystem at every step: several GB and minutes more):
#   ${HAMI_CACHE:-$HOME/.cache/hami}/images/buildah/<driver>   (bases and intermediate layers)
#   ${HAMI_CACHE:-$HOME/.cache/hami}/images/hami-<hash>.oci.tar
# <hash> covers every file of the build context, the base recipe and this script, so an
# unchanged tree returns the cached archive at once. Clear: rm -rf "$HAMI_CACHE/images".
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${HAMI_CACHE:-$HOME/.cache/hami}/images
DRIVER=${HAMI_BUILDAH_DRIVER:-overlay}
STORE=$CACHE/buildah/$DRIVER
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_PACKAGES=python3,python3-venv,ca-certificates
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)
# The chart's default image (values.yaml: ghcr.io + hami-py/hami, tag = appVersion), so the
# chart's defaults find it on a node where the archive was imported.
REF=${HAMI_IMAGE_REF:-ghcr.io/hami-py/hami:$VERSION}

log() { echo "build-image: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (buildah and debootstrap run as root here)"
command -v buildah >/dev/null || die "buildah is not installed (apt-get install -y buildah)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install -y debootstrap)"
[ -n "$VERSION" ] || die "no version found in $ROOT/pyproject.toml"

bah() { buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver "$DRIVER" "$@"; }

# The build context as docker would send it (.dockerignore applied by hand for the hash):
context_hash() {
    cd "$ROOT"
    { find Containerfile .dockerignore pyproject.toml README.md src native -type f \
        ! -path 'native/build/*' ! -path '*/__pycache__/*' ! -name '*.pyc' \
        ! -path '*.egg-info/*' ! -name '*_pb2*.py' | LC_ALL=C sort | xargs sha256sum
      echo "$SUITE $MIRROR $BASE_PACKAGES $REF"
      sha256sum "$ROOT/scripts/build-image.sh"
    } | sha256sum | cut -c1-16
}

KEY=$(context_hash)
OUT=$CACHE/hami-$KEY.oci.tar
if [ -f "$OUT" ]; then
    log "cached: $OUT"
    echo "$OUT"
    exit 0
fi

mkdir -p "$CACHE" "$STORE"
exec 9>"$CACHE/.build-image.lock"
flock 9
if [ -f "$OUT" ]; then  # built by another run while this one waited for the lock
    echo "$OUT"
    exit 0
fi

BASE_KEY=$(echo "$SUITE $MIRROR $BASE_PACKAGES $(sed -n '/^build_base()/,/^}/p' "$0")" | sha256sum | cut -c1-16)
BASE=localhost/hami/base:$SUITE-$BASE_KEY

build_base() {
    log "assembling the base $BASE with debootstrap ($SUITE, $MIRROR)"
    ctr=$(bah from scratch)
    mnt=$(bah mount "$ctr")
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$mnt" "$MIRROR" >&2 \
        || { bah rm "$ctr" >/dev/null; die "debootstrap failed"; }
    rm -rf "$mnt"/var/cache/apt/archives/*.deb "$mnt"/var/lib/apt/lists/* "$mnt"/var/log/* \
        "$mnt"/usr/share/doc/* "$mnt"/usr/share/man/* "$mnt"/usr/share/info/*
    bah umount "$ctr" >/dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash --label org.opencontainers.image.title="debian $SUITE + python3 (hami offline base)" "$ctr"
    bah commit --rm "$ctr" "$BASE" >/dev/null
}

if ! bah inspect --type image "$BASE" >/dev/null 2>&1; then
    build_base
else
    log "base $BASE is in $STORE"
fi

# Trust during the build what this machine trusts (its network may re-sign TLS with a local CA):
# the host's CA bundle and a pip.conf naming it are mounted for the RUN steps only, so neither
# ends up in a layer of the image.
CA=${HAMI_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
TRUST=
if [ -f "$CA" ]; then
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$STORE/pip.conf"
    TRUST="--volume $CA:/etc/ssl/certs/ca-certificates.crt:ro --volume $STORE/pip.conf:/etc/pip.conf:ro"
fi

REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
log "building $REF from $ROOT/Containerfile"
# shellcheck disable=SC2086  # TRUST is a list of options
bah bud --isolation chroot --layers --pull=never $TRUST -f "$ROOT/Containerfile" \
    --build-arg BASE="$BASE" --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
    -t "$REF" "$ROOT" >&2
bah push --quiet "$REF" "oci-archive:$OUT.tmp:$REF" >&2
mv -f "$OUT.tmp" "$OUT"
log "wrote $OUT"
# Keep the three newest archives (other checkouts on this machine may use the older ones), and
# bound buildah's storage: every change of src/ leaves its layers behind as untagged images
# (about 130 MB each); past 4 GB they go, at the price of one slower build next time.
ls -t "$CACHE"/hami-*.oci.tar | tail -n +4 | xargs -r rm -f
if [ "$(du -sm "$STORE" | cut -f1)" -gt 4096 ]; then
    log "pruning untagged images from $STORE"
    bah rmi --prune >/dev/null 2>&1 || log "pruning failed (harmless; rm -rf $CACHE/buildah to reclaim)"
fi
echo "$OUT"
