#!/usr/bin/env bash
# Builds Koordinator's components (koord-scheduler, koordlet, koord-manager) from its Go module at
# a pinned version, for running Koordinator's "GPU share with HAMi" path against this project's
# image (issue 28; docs/integrations.md "Koordinator"). A prerequisite of `make test` (`make koord`).
#
#   cache:  ${HAMI_CACHE:-$HOME/.cache/hami}/koord/<koordinator version>/bin   (the binaries)
#           ${HAMI_CACHE:-$HOME/.cache/hami}/koord/<koordinator version>/crd   (config/crd/bases)
#   clear:  rm -rf "${HAMI_CACHE:-$HOME/.cache/hami}/koord"
#
# Koordinator's go.mod pins its Kubernetes libraries with `replace` directives, which only apply
# when building inside its own module: the script copies the downloaded module (the module cache
# is read-only) into a work directory and builds there. Each binary is rebuilt only when its pin
# (recorded next to it as .<name>.pin) changes, so a second run takes seconds.
#
# koordlet needs cgo and libpfm (its perf_group package links -lpfm): as root on Debian the
# script installs gcc and libpfm4-dev through scripts/apt-install.sh; elsewhere install them.
# Needs: Go, network access to the Go module proxy (`go env GOPROXY`), python3.
# HAMI_KOORD_COMPONENTS="koord-scheduler koordlet" limits what is built (default: all three).
set -euo pipefail

# An exact version: the proxy refuses to list Koordinator's versions, so no "latest" lookup.
KOORD_VERSION=v1.7.0
KOORD_MODULE=github.com/koordinator-sh/koordinator
COMPONENTS=${HAMI_KOORD_COMPONENTS:-koord-scheduler koordlet koord-manager}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${HAMI_CACHE:-$HOME/.cache/hami}
ROOT=$CACHE/koord/$KOORD_VERSION
BIN=$ROOT/bin
WORK=$CACHE/koord/build-$KOORD_VERSION
SRC=$WORK/src
LOCK=$CACHE/koord/.install.lock

# GOFLAGS: the copy's go.sum is the upstream one; -mod=mod lets go add a missing sum line to the
# copy instead of stopping (the pins in go.mod stay as they are).
export GOWORK=off GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"

log() { printf '[install-koord %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*"; exit 1; }

for component in $COMPONENTS; do
    case $component in
        koord-scheduler | koordlet | koord-manager) ;;
        *) die "HAMI_KOORD_COMPONENTS: unknown component '$component' (koord-scheduler, koordlet, koord-manager)" ;;
    esac
done
command -v go >/dev/null || die "go is not on PATH; install Go to build Koordinator"
command -v python3 >/dev/null || die "python3 is not on PATH"
mkdir -p "$BIN" "$WORK"

# One install at a time per cache.
exec 9>"$LOCK"
if command -v flock >/dev/null && ! flock -n 9; then
    log "another install-koord.sh is running on $CACHE/koord; waiting for it"
    flock 9
fi

# koordlet's go-nvml (v0.11.6-0.0.20220823) links the NVML calls with
# --unresolved-symbols=ignore-in-object-files and expects them bound when it dlopens
# libnvidia-ml.so.1; linked as a plain executable here, they get no dynamic symbol and nvmlInit_v2
# jumps to address 0 (SIGSEGV, PC=0), with any NVML. --export-dynamic keeps them dynamic.
NVML_LDFLAGS="-extldflags=-Wl,--export-dynamic"
pin_of() {
    local extra=
    [[ $1 == koordlet ]] && extra=" $NVML_LDFLAGS"
    echo "$KOORD_MODULE@$KOORD_VERSION ./cmd/$1 cgo=$2$extra"
}
cached() { [[ -x $BIN/$1 && -f $BIN/.$1.pin && "$(cat "$BIN/.$1.pin")" == "$2" ]]; }

# step 1: the module source, copied to a writable directory (once per version)
prepare_source() {
    [[ -f $SRC/.complete ]] && return 0
    local start=$SECONDS dir
    log "downloading $KOORD_MODULE@$KOORD_VERSION from $(go env GOPROXY)"
    dir=$(cd "$WORK" && GOFLAGS= go mod download -json "$KOORD_MODULE@$KOORD_VERSION" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or ""); sys.exit(d.get("Error") or 0)') ||
        die "step 'download': go mod download $KOORD_MODULE@$KOORD_VERSION failed (see above)"
    [[ -f $dir/go.mod ]] || die "step 'download': no go.mod in '$dir'"
    rm -rf "$SRC" && mkdir -p "$SRC"
    cp -R "$dir/." "$SRC/" || die "step 'copy': copying $dir to $SRC failed"
    chmod -R u+w "$SRC"
    log "fetching the module's dependencies (go mod download in $SRC)"
    (cd "$SRC" && go mod download) || die "step 'dependencies': go mod download in $SRC failed (see above)"
    touch "$SRC/.complete"
    log "source ready in $SRC ($((SECONDS - start))s)"
}

# step 3: the C parts koordlet links (libpfm through cgo)
koordlet_prerequisites() {
    "$HERE/apt-install.sh" install-koord "koordlet's build" gcc libc6-dev libpfm4-dev
    command -v gcc >/dev/null || die "step 'koordlet prerequisites': gcc is missing (koordlet needs cgo)"
    [[ -f /usr/include/perfmon/pfmlib.h || -f /usr/local/include/perfmon/pfmlib.h ]] ||
        die "step 'koordlet prerequisites': perfmon/pfmlib.h is missing (Debian: libpfm4-dev; koordlet's perf_group package includes it)"
}

# step 4, build NAME CGO: go build ./cmd/NAME inside the copied module
build() {
    local name=$1 cgo=$2 pin start=$SECONDS ldflags="-s -w"
    pin=$(pin_of "$name" "$cgo")
    [[ $name == koordlet ]] && ldflags="$ldflags $NVML_LDFLAGS"
    if cached "$name" "$pin"; then
        log "$name: cached ($pin)"
        return 0
    fi
    log "$name: building $pin (first time: this takes a while)"
    (cd "$SRC" && CGO_ENABLED=$cgo go build -trimpath -ldflags="$ldflags" -o "$BIN/.$name.new" "./cmd/$name") ||
        die "step 'build $name': go build ./cmd/$name in $SRC failed (see the messages above)"
    if [[ $name == koordlet ]] && command -v nm >/dev/null &&
        ! nm -D "$BIN/.$name.new" | grep ' nvmlInit_v2$' >/dev/null; then
        # (not grep -q: it exits at the first match, nm dies of SIGPIPE, and pipefail fails the test)
        die "step 'build koordlet': nvmlInit_v2 is not a dynamic symbol of the binary (its NVML calls would jump to address 0)"
    fi
    mv -f "$BIN/.$name.new" "$BIN/$name"
    echo "$pin" > "$BIN/.$name.pin"
    log "$name: built in $((SECONDS - start))s"
}

total=$SECONDS
need_source=
for component in $COMPONENTS; do
    cgo=0
    [[ $component == koordlet ]] && cgo=1
    cached "$component" "$(pin_of "$component" "$cgo")" || need_source=1
done
[[ -n $need_source || ! -d $ROOT/crd ]] && prepare_source

# step 2: the CRDs (Device, Reservation, NodeMetric, ...), which the components expect installed
# before they start; copied first, so that they are there even if a build below fails
if [[ ! -d $ROOT/crd ]]; then
    rm -rf "$ROOT/.crd.new" && mkdir -p "$ROOT/.crd.new"
    install -m 0644 "$SRC"/config/crd/bases/*.yaml "$ROOT/.crd.new/" ||
        die "step 'crds': copying $SRC/config/crd/bases failed"
    mv "$ROOT/.crd.new" "$ROOT/crd"
fi
log "CRDs: $(ls "$ROOT/crd" | wc -l) files in $ROOT/crd"

for component in $COMPONENTS; do
    case $component in
        koordlet)
            cached koordlet "$(pin_of koordlet 1)" || koordlet_prerequisites
            build koordlet 1
            ;;
        *) build "$component" 0 ;;
    esac
done

log "Koordinator $KOORD_VERSION ready in $BIN ($((SECONDS - total))s)"
