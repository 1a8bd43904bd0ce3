#!/usr/bin/env bash
# Installs the Kubernetes binaries the integration tests run (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl, kubelet, kube-proxy, kwok, helm) and the real
# node's container runtime (containerd, its runc shim and ctr: Debian 12's containerd 1.6 has no
# CDI, which the DRA path needs) into a cache directory outside the repository, built from Go
# modules at pinned versions.
#
#   cache:  ${HAMI_CACHE:-$HOME/.cache/hami}/kube/<kube version>/bin
#   clear:  rm -rf "${HAMI_CACHE:-$HOME/.cache/hami}/kube"
#
# Each binary is rebuilt only when its pin (recorded next to it as .<name>.pin) changes, so
# a second run takes seconds. The first run compiles Kubernetes and takes many minutes.
# Needs: Go (>= the versions the modules declare), network access to the Go module proxy.
set -euo pipefail

# The project's pin (the newest stable release with DRA consumable capacity and extended-resource
# mapping on by default; its etcd minor is 3.7). HAMI_KUBE_VERSION=v1.34.4 selects the previous pin
# (opt-in; each version has its own cache directory, so switching back and forth rebuilds nothing).
KUBE_DEFAULT=v1.37.2
KUBE_VERSION=${HAMI_KUBE_VERSION:-$KUBE_DEFAULT}  # k8s.io/kubernetes; staging modules are v0.<minor>.<patch>
case $KUBE_VERSION in
    # go.etcd.io/etcd/server/v3: the etcd minor each Kubernetes release is tested with
    # (build/dependencies.yaml of k8s.io/kubernetes), newest patch of it
    v1.34.*) ETCD_VERSION=v3.6.16 ;;
    v1.37.*) ETCD_VERSION=v3.7.3 ;;
    *) echo "install-kube.sh: HAMI_KUBE_VERSION=$KUBE_VERSION is not supported (v1.34.x or v1.37.x)" >&2; exit 2 ;;
esac
KWOK_VERSION=v0.8.0        # sigs.k8s.io/kwok
HELM_VERSION=v3.19.5       # helm.sh/helm/v3
CONTAINERD_VERSION=v1.7.35 # github.com/containerd/containerd: CDI (enable_cdi), the config format of 1.6, cgroup v1
STAGING_VERSION=v0${KUBE_VERSION#v1}

CACHE=${HAMI_CACHE:-$HOME/.cache/hami}
BIN=$CACHE/kube/$KUBE_VERSION/bin
WORK=$CACHE/kube/build
LOCK=$CACHE/kube/.install.lock
if [[ $KUBE_VERSION != "$KUBE_DEFAULT" ]]; then
    # another version builds in its own work directory under its own lock, so that a long
    # first build of it does not hold up installs of the pinned version
    WORK=$CACHE/kube/build-$KUBE_VERSION
    LOCK=$CACHE/kube/.install-$KUBE_VERSION.lock
fi

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"

log() { printf '[install-kube %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "go is not on PATH; install Go to build the Kubernetes binaries"
command -v python3 >/dev/null || die "python3 is not on PATH"
mkdir -p "$BIN" "$WORK"

# One install at a time per cache (several checkouts may run `make test` at once).
exec 9>"$LOCK"
if command -v flock >/dev/null && ! flock -n 9; then
    log "another install-kube.sh is running on $CACHE/kube; waiting for it"
    flock 9
fi

# Copies the replace directives of an upstream go.mod into the current throwaway module.
# Replacements by another module are kept as they are; replacements by a local directory
# (Kubernetes staging, etcd sibling modules) become the published module at $2.
copy_replaces() {
    local gomod=$1 local_version=$2
    go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]
    if "FORBIDDEN" in new["Path"]:
        continue
    target = new["Path"] + "@" + new["Version"] if new.get("Version") else old + "@" + sys.argv[1]
    print("-replace=" + old + "=" + target)
' "$local_version" | xargs -r go mod edit
}

# build NAME MODULE VERSION LOCAL_VERSION PACKAGE [LDFLAGS]
build() {
    local name=$1 module=$2 version=$3 local_version=$4 pkg=$5 ldflags=${6:-}
    local pin="$module@$version $pkg"
    if [[ -x $BIN/$name && -f $BIN/.$name.pin && "$(cat "$BIN/.$name.pin")" == "$pin" ]]; then
        log "$name: cached ($pin)"
        return 0
    fi
    # the same pin already built for another Kubernetes version (etcd, kwok, helm): reuse it
    local other
    for other in "$CACHE"/kube/v*/bin/."$name".pin; do
        if [[ -f $other && $other != "$BIN/.$name.pin" && "$(cat "$other")" == "$pin" && -x ${other%/*}/$name ]]; then
            install -m 0755 "${other%/*}/$name" "$BIN/.$name.new"
            mv -f "$BIN/.$name.new" "$BIN/$name"
            echo "$pin" > "$BIN/.$name.pin"
            log "$name: copied from ${other%/*} ($pin)"
            return 0
        fi
    done
    local start=$SECONDS dir=$WORK/$name
    log "$name: building $pin (first time: this takes a while)"
    rm -rf "$dir" && mkdir -p "$dir"
    (
        cd "$dir"
        go mod init hami.local/build/"$name" >/dev/null 2>&1
        local gomod
        gomod=$(go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
        copy_replaces "$gomod" "$local_version"
        go get "$pkg@$version" 2>&1 | grep -vE '^go: (downloading|added|upgraded|finding)' || true
        go build -trimpath -ldflags="-s -w $ldflags" -o "$BIN/.$name.new" "$pkg"
    ) || die "$name: build of $pin failed (see the messages above)"
    mv -f "$BIN/.$name.new" "$BIN/$name"
    echo "$pin" > "$BIN/.$name.pin"
    log "$name: built in $((SECONDS - start))s"
}

total=$SECONDS
kv=k8s.io/component-base/version
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
kube_ldflags="-X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor -X $kv.gitTreeState=clean -X $kv.buildDate=1970-01-01T00:00:00Z"
kube_ldflags="$kube_ldflags -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

build etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION" go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes "$KUBE_VERSION" "$STAGING_VERSION" k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kube-scheduler k8s.io/kubernetes "$KUBE_VERSION" "$STAGING_VERSION" k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
build kube-controller-manager k8s.io/kubernetes "$KUBE_VERSION" "$STAGING_VERSION" k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
build kubectl k8s.io/kubernetes "$KUBE_VERSION" "$STAGING_VERSION" k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
# the real node of `hami-dev cluster up --real-node` (runs pods through containerd + runc)
build kubelet k8s.io/kubernetes "$KUBE_VERSION" "$STAGING_VERSION" k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
# Services on the real node (pods reach the API server at the `kubernetes` ClusterIP), iptables mode
build kube-proxy k8s.io/kubernetes "$KUBE_VERSION" "$STAGING_VERSION" k8s.io/kubernetes/cmd/kube-proxy "$kube_ldflags"
build kwok sigs.k8s.io/kwok "$KWOK_VERSION" "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
# kwok needs its Stage objects (what it does to fake nodes and pods) as configuration: keep
# the "fast" stages of the pinned kwok release next to the binaries.
kwok_dir=$(cd "$WORK" && GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
mkdir -p "$BIN/../kwok-stages"
for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    install -m 0644 "$kwok_dir/kustomize/stage/$f.yaml" "$BIN/../kwok-stages/"
done
log "kwok stages: $(cd "$BIN/../kwok-stages" && echo *.yaml)"
build helm helm.sh/helm/v3 "$HELM_VERSION" "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"

# the real node's runtime (runc itself comes from Debian, scripts/install-node.sh); CGO off leaves
# out the btrfs snapshotter, which the node's configuration disables anyway
ctrd_ldflags="-X github.com/containerd/containerd/version.Version=$CONTAINERD_VERSION"
for name in containerd containerd-shim-runc-v2 ctr; do
    build "$name" github.com/containerd/containerd "$CONTAINERD_VERSION" "$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/cmd/$name" "$ctrd_ldflags"
done

log "all binaries ready in $BIN ($((SECONDS - total))s)"
