"""What the scheduler knows, fed by watches: nodes' devices, pods' allocations, quotas.

The ledger (``hami.core.Ledger``) is rebuilt from the API server: node registration
annotations and pod allocation annotations. Handlers are level-triggered (a relist replaces
everything); the only state that exists nowhere else is a Filter reservation whose pod patch
has not come back through the watch yet (kept until the pod's annotations arrive, rolled
back by the extender when the patch fails). A bound pod's grant is final: the first one the
ledger read from a bound copy counts until the pod ends or goes, whatever its owner writes into
its annotations later (as HAMi's scheduler keeps the first it saw). A bound pod whose grant for
some vendor cannot be read holds devices of that vendor on its node that nobody can name: what
can be read counts, and that vendor's devices on the node take no new pod until the grant can be
read or the pod ends (:class:`UnreadableGrant`; HAMi counted such a pod as holding nothing).

The DRA front end's allocations are learnt too (either front end): ResourceClaims allocated by
driver ``gpu.hami.io`` (read by :func:`hami.dra.claims.claim_usage`) count against their
namespace's quota in the ledger (:meth:`hami.core.Ledger.set_claim`), and the driver's
ResourceSlices give the GPUs' sizes (a claim that recorded no consumed amount took the whole
device) and the UI's DRA devices. Pods with ResourceClaims are cached for the UI.

Node health follows HAMi's handshake semantics per vendor (§4.4): a node's devices count
while the kubelet advertises the vendor's count resource (``status.allocatable``), or while
its ``hami.io/node-handshake`` is not a ``Requesting_<time>`` older than 60 s (the time in
today's form or in the one HAMi up to v2.3 wrote, :func:`hami.core.health.handshake_time`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

from hami.core import (
    CoreError,
    Ledger,
    SchedulerConfig,
    make_allocation,
    pod_key,
    read_node_devices,
)
from hami.core.grants import cordon_vendors, read_grants, unreadable_vendors
from hami.core.health import handshake_time
from hami.core.names import BIND_PHASE, DEVICE_CORDON, NODE_ANNOTATION_PREFIX, VGPU_NODE
from hami.core.quantity import parse_int_quantity
from hami.core.types import NodeDevices
from hami.dra.claims import ClaimError, ClaimUsage, claim_ask, claim_usage, class_sizes, slice_devices
from hami.dra.model import DRIVER as DRA_DRIVER
from hami.kube.revision import revision
from hami.webhook.admission import claim_devices, gpu_count_room

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 60.0
REQUESTING = "Requesting_"
HANDSHAKE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # Go time.DateTime, local time (§4.3)
DONE_PHASES = ("success", "failed")
TOMBSTONES = 4096  # deleted pod UIDs remembered (with the delete's resourceVersion)
# how long a ResourceClaim this replica's webhook admitted holds its ask against the next claims'
# quota check before the claim's watch event arrives (normally milliseconds; a create the API
# server refused after admission never arrives, and a forged review must not hold a namespace's
# room for long: see admit_claim)
ADMITTED_CLAIM_TTL = 5.0
ADMITTED_PER_NAMESPACE = 256  # at most this many such admissions counted per namespace


def handshake_value(now: float) -> str:
    return REQUESTING + datetime.fromtimestamp(now).strftime(HANDSHAKE_TIME_FORMAT)


def _allocatable(node: Mapping[str, Any], resource: str) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        return parse_int_quantity(value, resource) if value is not None else 0
    except CoreError:
        return 0


def vendor_alive(node: Mapping[str, Any], vendor: Any, now: float) -> bool:
    """HAMi's CheckHealth outcome for one vendor on one node (see the module docstring)."""
    if _allocatable(node, vendor.resources.count) > 0:
        return True
    key = vendor.handshake_annotation
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(key or "", "")
    if not key or REQUESTING not in value:
        return True
    _, _, stamp = value.partition("_")
    written = handshake_time(stamp)
    if written is None:
        return True  # (as HAMi: an unreadable time is no proof the plugin is gone)
    try:
        return now - written.timestamp() < HANDSHAKE_TIMEOUT_S
    except (OverflowError, OSError, ValueError):  # a date the platform cannot place (year 1)
        return True


def schedulable_node(node: Mapping[str, Any], vendors: Iterable[Any], now: float) -> tuple[NodeDevices, dict[str, str]]:
    """A Node dict -> (its devices, without the vendors whose node side is not alive nor those
    whose registration cannot be read; ``{vendor: why}`` for the latter). Raises CodecError when
    the Node object itself is of the wrong shape."""
    alive = [v for v in vendors if vendor_alive(node, v, now)]
    return read_node_devices(node, alive)


def _node_fingerprint(node: Mapping[str, Any], vendors: Iterable[Any], now: float) -> tuple:
    """What a node's devices are read from: the ``hami.io/node-*`` annotations, the cordon, each
    vendor's registration and the other node annotations it reads (``node_annotations``: the
    Ascend ``hami-vnpu-core`` mode), and each vendor's liveness."""
    vendors = list(vendors)
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    read = {v.register_annotation for v in vendors if v.register_annotation}
    read.update(k for v in vendors for k in getattr(v, "node_annotations", ()))
    keys = sorted(k for k in annotations if k.startswith((NODE_ANNOTATION_PREFIX, DEVICE_CORDON)) or k in read)
    # vendors that make their devices from the node's capacity (Kunlun, MetaX, Enflame, Neuron,
    # Cambricon, Mthreads): a changed count is a changed device list
    names = {
        n
        for v in vendors
        for n in (getattr(getattr(v, "resources", None), f, "") for f in ("count", "memory", "cores"))
        if n
    }
    capacity = (node.get("status") or {}).get("capacity") or {}
    counts = tuple(sorted((k, str(capacity[k])) for k in names if k in capacity))
    return (tuple((k, annotations[k]) for k in keys), tuple(vendor_alive(node, v, now) for v in vendors), counts)


#: why a device is ``CardCordoned`` while a running pod's grant on its node cannot be read
#: (:class:`UnreadableGrant`): no ``hami.io/device-cordon`` entry is behind it, and the pod is not
#: named (the UI shows the words to every tenant)
HELD_BACK = "held back: a running pod's allocation on this node cannot be read"


@dataclasses.dataclass(frozen=True, slots=True)
class UnreadableGrant:
    """A running (bound, not finished) pod whose allocation annotation of some vendor cannot be
    read: ``errors`` is ``{vendor: why}``. Until it is readable or the pod ends, the vendor's
    devices on ``node`` are cordoned (``CardCordoned``, explained as :data:`HELD_BACK`): counting
    them free let a new pod onto a GPU the running one uses."""

    pod: str  # "ns/name"
    node: str
    errors: Mapping[str, str]


def selector_matches(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class ClusterState:
    """Caches + ledger. Not thread-safe: everything runs on one asyncio loop."""

    def __init__(
        self,
        config: SchedulerConfig,
        scheduler_name: str = "hami-scheduler",
        node_selector: Mapping[str, str] | None = None,
        clock=time.time,
    ) -> None:
        self.config = config
        self.vendors = config.vendors
        self.scheduler_name = scheduler_name
        self.node_selector = dict(node_selector or {})
        self.clock = clock
        self.ledger = Ledger(config.vendors)
        self.nodes: dict[str, dict] = {}  # name -> Node (all nodes, selector applied in the ledger)
        # the nodes ``node_selector`` leaves out (Filter refuses them NodeLabelSelectorMismatch,
        # not "node unregistered"), and a counter moved on each change of that set
        self.unselected: set[str] = set()
        self.unselected_generation = 0
        self.pods: dict[str, dict] = {}  # "ns/name" -> Pod (ours or carrying an allocation)
        # deleted pod UIDs, oldest first (bounded; a plain dict: its order is insertion's, and no
        # value is kept: the delete's resourceVersion was stored here and never read)
        self._deleted: dict[str, None] = {}
        self._deleted_nodes: dict[str, None] = {}  # deleted Node UIDs, the same way
        # ledger keys whose allocation was read from a bound copy of the pod: final from then on
        # (apply_pod keeps that grant whatever the annotations say later)
        self._final: set[str] = set()
        # the latest resourceVersion the pod list or watch has shown: a later list can only be at
        # this version or after, unless the API server's store went back (an etcd restore)
        self._pods_watched_to: int | None = None
        self.quotas: dict[str, dict] = {}  # "ns/name" -> ResourceQuota
        # the DRA front end (driver gpu.hami.io): allocated claims and the driver's slices
        self.claims: dict[str, ClaimUsage] = {}  # "ns/name" -> what the claim holds
        # "ns/name" -> (memory MiB, cores) a claim not allocated yet asks: it counts against the
        # quota from its creation, as Kubernetes' own quota counts claims (claims created together
        # could otherwise all pass the webhook, kube-scheduler allocating without any quota)
        self.waiting_claims: dict[str, tuple[int, int]] = {}
        #: "ns/name" -> the devices of this driver a claim holds, or asks while not allocated
        #: (what a GPU count quota counts of it: :meth:`gpu_count_room`)
        self.claim_device_counts: dict[str, int] = {}
        # claims the webhook admitted that no watch event has shown yet: key -> (namespace, name,
        # generateName, (memory, cores), expiry on time.monotonic()); counted by claim_room only
        self._admitted: dict[int, tuple[str, str, str, tuple[int, int], float]] = {}
        self._admitted_seq = 0
        self._claim_uids: dict[str, str] = {}  # "ns/name" -> the uid of the claim counted under it
        self.slices: dict[str, dict] = {}  # ResourceSlice name -> ResourceSlice (this driver's only)
        self.dra_devices: dict[tuple[str, str], dict] = {}  # (node, device) -> hami.dra.claims.slice_devices
        self._dra_totals: dict[tuple[str, str], dict] = {}  # (node, device) -> its capacity values
        self._class_sizes: dict[str, int] | None = None  # claim_sizes(), None: to be worked out again
        self._slice_keys: dict[str, tuple[tuple[str, str], ...]] = {}  # slice name -> its devices' keys
        dra = [v.name for v in self.vendors if v.name == "NVIDIA"]
        self.dra_vendor = dra[0] if dra else "NVIDIA"  # whose quota a claim counts against
        self._fingerprints: dict[str, tuple] = {}
        # the node locks the vendors declare, and the nodes that carry one of them now
        self.lock_keys = frozenset(k for k in (getattr(v, "lock_annotation", None) for v in self.vendors) if k)
        self.locked_nodes: set[str] = set()
        # (node, lock key) -> (the lock's value, the node's resourceVersion where this replica first
        # saw that value), and "ns/name" -> (UID, resourceVersion) of that name's last deletion seen
        # (bounded): a lock seen before its holder's name was deleted was the deleted pod's
        # (lock_predates)
        self._lock_seen: dict[tuple[str, str], tuple[str, int | None]] = {}
        self._gone_names: dict[str, tuple[str, int]] = {}
        self._node_changed: dict[str, asyncio.Event] = {}
        self._pod_finished: asyncio.Event | None = None  # set when some pod finished its allocation or went away
        self.warnings: list[str] = []
        #: called with (node, message) when a node's registration cannot be read (an event), once
        #: per vendor whose registration it is (or once for the whole node when the Node object
        #: itself is of the wrong shape)
        self.on_malformed: Callable[[dict, str], None] | None = None
        #: node -> {vendor: why its registration there is left out}, as last read (the key ``""``:
        #: the Node object itself is of the wrong shape, every vendor's devices are left out)
        self.registration_errors: dict[str, dict[str, str]] = {}
        #: pod key -> the grant of a running pod that cannot be read (see UnreadableGrant)
        self.unreadable: dict[str, UnreadableGrant] = {}
        #: called with (pod, message) when a running pod's grant is found unreadable (an event; once
        #: per change of what cannot be read, not on every watch event)
        self.on_unreadable_pod: Callable[[dict, str], None] | None = None

    # ------------------------------------------------------------------ nodes
    @property
    def node_handler(self) -> "_Handler":
        return _Handler(self._replace_nodes, self._apply_node)

    def _replace_nodes(self, items: list[dict], resource_version: str | None = None) -> None:
        names = {(n.get("metadata") or {}).get("name") for n in items}
        for name in list(self.nodes):
            if name not in names:
                self._apply_node("DELETED", self.nodes[name])
        for n in items:
            self._apply_node("MODIFIED", n)

    def _apply_node(self, kind: str, node: dict) -> None:
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        if kind == "DELETED":
            cached_uid = ((self.nodes.get(name) or {}).get("metadata") or {}).get("uid")
            if cached_uid and meta.get("uid") and cached_uid != meta["uid"]:
                _remember(self._deleted_nodes, meta["uid"])
                return  # an earlier node of that name: the one cached was made since
            _remember(self._deleted_nodes, meta.get("uid"))
            self.nodes.pop(name, None)
            self._select(name, True)
            self._fingerprints.pop(name, None)
            self.registration_errors.pop(name, None)
            self.locked_nodes.discard(name)
            for key in self.lock_keys:
                self._lock_seen.pop((name, key), None)
            self.ledger.remove_node(name)
        else:
            self.nodes[name] = node
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            if any(k in annotations for k in self.lock_keys):
                self.locked_nodes.add(name)
            else:
                self.locked_nodes.discard(name)
            for key in self.lock_keys:
                value = annotations.get(key) if isinstance(annotations, Mapping) else None
                if not isinstance(value, str):
                    self._lock_seen.pop((name, key), None)
                elif (self._lock_seen.get((name, key)) or ("",))[0] != value:
                    self._lock_seen[(name, key)] = (value, revision(node))
            self._refresh_node(name, node)
        self._wake(name)

    def _refresh_node(self, name: str, node: dict, force: bool = False) -> None:
        now = self.clock()
        try:
            selected = selector_matches(node, self.node_selector)
            self._select(name, selected)
            if not selected:
                self._fingerprints.pop(name, None)
                self.registration_errors.pop(name, None)
                self.ledger.remove_node(name)
                return
            blind = self._blind_vendors(name)
            fp = (_node_fingerprint(node, self.vendors, now), blind)
            if not force and self._fingerprints.get(name) == fp:
                return
            self._fingerprints[name] = fp
            devices, errors = schedulable_node(node, self.vendors, now)
            devices = cordon_vendors(devices, blind)
        except (CoreError, ArithmeticError, LookupError, TypeError, AttributeError, RecursionError) as exc:
            # whatever the failure, a node we cannot read is a malformed one: its devices leave
            # the ledger (no stale GPUs stay in use) and the node gets an event
            message = str(exc) if isinstance(exc, CoreError) else f"{type(exc).__name__}: {exc}"
            log.warning("node %s: ignoring its devices: %s", name, message)
            self.registration_errors[name] = {"": message}
            self.ledger.remove_node(name)
            if self.on_malformed is not None:
                self.on_malformed(node, message[:1000])
            return
        # one vendor's unreadable registration takes that vendor's devices out, and only them
        # (HAMi's RegisterFromNodeAnnotations goes on with the other vendors): its stale devices
        # leave the ledger, the node gets an event per such vendor. The pods holding them stay
        # recorded; they count again when the registration can be read again (Ledger.set_node).
        for vendor, message in errors.items():
            log.warning("node %s: ignoring its %s devices: %s", name, vendor, message)
            if self.on_malformed is not None:
                self.on_malformed(node, message[:1000])
        if errors:
            self.registration_errors[name] = errors
        else:
            self.registration_errors.pop(name, None)
        if devices.devices:
            self.ledger.set_node(devices)
        else:
            self.ledger.remove_node(name)

    def _blind_vendors(self, name: str) -> frozenset[str]:
        """The vendors whose devices on node ``name`` a running pod holds unreadably."""
        return frozenset(v for g in self.unreadable.values() if g.node == name for v in g.errors)

    def held_back_vendors(self, name: str) -> frozenset[str]:
        """The vendors whose devices on node ``name`` are cordoned because a running pod's grant
        there cannot be read (their ``CardCordoned`` is :data:`HELD_BACK`, whatever
        ``hami.io/device-cordon`` says)."""
        return self._blind_vendors(name)

    def _set_unreadable(self, key: str, grant: UnreadableGrant | None, pod: dict | None = None) -> None:
        """Record (or clear, None) pod ``key``'s unreadable grant; the nodes concerned are read
        again (their cordons follow)."""
        old = self.unreadable.get(key)
        if old == grant:
            return
        if grant is None:
            del self.unreadable[key]
        else:
            self.unreadable[key] = grant
            if old is None or old.errors != grant.errors:
                message = (
                    f"{'; '.join(grant.errors.values())}; the pod runs on node {grant.node}, whose "
                    f"{', '.join(sorted(grant.errors))} devices take no new pod until its grant can be "
                    "read or it ends"
                )
                log.warning("%s", message)
                if self.on_unreadable_pod is not None and pod is not None:
                    self.on_unreadable_pod(pod, message[:1000])
        for name in {g.node for g in (old, grant) if g is not None}:
            node = self.nodes.get(name)
            if node is not None:
                self._refresh_node(name, node)

    def _read_allocation(self, pod: Mapping[str, Any]) -> tuple[Any, dict[str, str]]:
        """``(the pod's allocation, {vendor: why its grant cannot be read})``: one vendor's
        malformed annotation leaves out that vendor's grant only (:func:`hami.core.grants.read_grants`,
        which ``hami simulate`` reads with too)."""
        return read_grants(pod, self.vendors)

    def _select(self, name: str, selected: bool) -> None:
        """Record whether the node selector takes node ``name`` (a deleted node: True)."""
        if selected == (name not in self.unselected):
            return
        if selected:
            self.unselected.discard(name)
        else:
            self.unselected.add(name)
        self.unselected_generation += 1

    def recheck_nodes(self) -> None:
        """Re-evaluate time-dependent node health (handshake expiry)."""
        for name, node in self.nodes.items():
            self._refresh_node(name, node)

    def _wake(self, name: str) -> None:
        ev = self._node_changed.pop(name, None)
        if ev is not None:
            ev.set()

    async def node_changed(self, name: str, timeout: float) -> None:
        """Wait until the node's object changes (or ``timeout``)."""
        ev = self._node_changed.setdefault(name, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def put_node(self, node: dict) -> None:
        """Store a node object we just wrote (fresher than the watch), if it is newer and its
        deletion was not seen already (an answer that arrives after the node's DELETED event
        brought it back, GPUs and all, until the next relist)."""
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        if meta.get("uid") in self._deleted_nodes:
            return
        old = self.nodes.get(name)
        if old is None or _not_older(node, old):
            self._apply_node("MODIFIED", node)

    # ------------------------------------------------------------------ pods
    @property
    def pod_handler(self) -> "_Handler":
        return _Handler(self._replace_pods, self._watched_pod)

    def _watched_pod(self, kind: str, pod: dict) -> None:
        """A pod watch event (our own writes come through :meth:`put_pod`, not here)."""
        at = revision(pod)
        if at is not None and (self._pods_watched_to is None or at > self._pods_watched_to):
            self._pods_watched_to = at
        self.apply_pod(kind, pod)

    def _interesting(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        # pods with ResourceClaims are kept too: the UI names a DRA claim's containers from them
        return (
            spec.get("schedulerName") == self.scheduler_name
            or VGPU_NODE in (meta.get("annotations") or {})
            or bool(spec.get("resourceClaims"))
        )

    def _replace_pods(self, items: list[dict], resource_version: str | None = None) -> None:
        """The pods a (re)list returned, as of ``resource_version``. A cached pod the list does
        not name stays when the cache has it at a later version (created, or read by a Filter,
        after the list's snapshot: the watch from that version tells what becomes of it) or,
        where versions cannot be compared, while it holds a reservation (a decision whose Bind
        may be under way): dropping it freed GPUs a Bind then posted, and another pod got them."""
        listed_at = revision({"metadata": {"resourceVersion": resource_version}})
        if listed_at is not None and self._pods_watched_to is not None and listed_at < self._pods_watched_to:
            # The store went back (an etcd restore): the versions cached are from a history the
            # API server no longer has. The list is the truth: a cached copy "newer" than it is
            # not kept (every later event of that pod was dropped as stale, a finished pod held
            # its GPUs; a pod made after the snapshot stayed for good), and a pod seen deleted
            # may exist again, with its UID (its events were dropped: its GPUs looked free).
            log.warning(
                "pods listed at resourceVersion %s, before %s the watch had shown: the API server's "
                "store went back (an etcd restore?); the cache is rebuilt from the list",
                listed_at,
                self._pods_watched_to,
            )
            self.pods = {}
            self._deleted.clear()
            self._gone_names.clear()
            self._final.clear()  # (a grant read since may be one the store no longer has)
        if listed_at is not None:
            self._pods_watched_to = listed_at
        listed = {_ref(p): pod_key(p) for p in items}
        # (a cached pod the list names with another UID is a successor of the listed one, created
        # after the list's snapshot: its reservation stays just the same)
        kept = [
            pod
            for ref, pod in self.pods.items()
            if listed.get(ref) != pod_key(pod) and self._outlives_list(pod, resource_version)
        ]
        keys = {pod_key(p) for p in (*items, *kept)}
        for key in [k for k in self.unreadable if k not in keys]:
            self._set_unreadable(key, None)
        for alloc in self.ledger.pods():
            if alloc.key not in keys:
                self.ledger.remove_pod(alloc.key)
                self._final.discard(alloc.key)
        old, self.pods = self.pods, {_ref(p): p for p in kept}
        for ref, pod in old.items():
            if ref not in self.pods and pod_key(pod) not in keys and self._listed_after(pod, listed_at):
                # gone by the list's snapshot: a copy read before that (a lock owner's GET, a
                # Binding's re-read) applied after this must not bring it back, as after a delete
                # event (found by review, 1 Dec: its share and quota counted until the next relist)
                self._tombstone(pod)
        for p in items:
            cached = old.get(_ref(p))
            # a pod we wrote while the list was in flight stays (monotonic, like every path)
            keep = cached is not None and not _not_older(p, cached)
            self.apply_pod("MODIFIED", cached if keep else p)

    @staticmethod
    def _listed_after(pod: Mapping[str, Any], listed_at: int | None) -> bool:
        """The list at ``listed_at`` was taken after this copy of ``pod`` (versions comparable)."""
        mine = revision(pod)
        return mine is not None and listed_at is not None and mine <= listed_at

    def _outlives_list(self, pod: Mapping[str, Any], resource_version: str | None) -> bool:
        """A cached pod a list did not name is kept (see :meth:`_replace_pods`)."""
        try:
            listed_at = int(resource_version or "")
        except ValueError:
            listed_at = None
        mine = revision(pod)
        if mine is None or listed_at is None:
            return self.ledger.is_reserved(pod_key(pod))
        return mine > listed_at

    def _stale(self, pod: Mapping[str, Any]) -> bool:
        """An event older than what is cached, or for a pod whose deletion was seen already."""
        old = self.pods.get(_ref(pod))
        if old is not None and not _not_older(pod, old):
            return True
        return (pod.get("metadata") or {}).get("uid") in self._deleted  # a UID never comes back

    def was_deleted(self, uid: str) -> bool:
        """The pod watch has shown the deletion of the pod with this UID (a UID never comes back)."""
        return uid in self._deleted

    def _tombstone(self, pod: Mapping[str, Any]) -> None:
        _remember(self._deleted, (pod.get("metadata") or {}).get("uid"))

    def apply_pod(self, kind: str, pod: dict) -> None:
        """Store a watch event. Monotonic in resourceVersion: an older event than the cached
        pod, or any non-delete event for a UID already seen deleted, is dropped; a delete wins."""
        ref = _ref(pod)
        key = pod_key(pod)
        if kind == "DELETED":
            old = self.pods.get(ref)
            if old is None or pod_key(old) == key:
                self.pods.pop(ref, None)
            self._tombstone(pod)
            self.ledger.remove_pod(key)
            self._final.discard(key)
            if key in self.unreadable:
                self._set_unreadable(key, None)
            uid, at = (pod.get("metadata") or {}).get("uid"), revision(pod)
            if uid and at is not None:
                self._gone_names.pop(ref, None)
                self._gone_names[ref] = (uid, at)
                while len(self._gone_names) > TOMBSTONES:
                    del self._gone_names[next(iter(self._gone_names))]
            self._wake_lock_waiters(pod, True)
            return
        if self._stale(pod):
            log.debug(
                "pod %s: dropping a stale event (resourceVersion %s)",
                ref,
                (pod.get("metadata") or {}).get("resourceVersion"),
            )
            return
        if not self._interesting(pod) and self.ledger.pod(key) is None and key not in self.unreadable:
            # (a pod the ledger holds is followed whatever it says now: one placed with our
            # annotations under another scheduler's name, its owner removing hami.io/vgpu-node,
            # held its GPUs and quota after it finished, until it was deleted)
            return
        self.pods[ref] = pod
        self._wake_lock_waiters(pod, False)
        alloc, errors = self._read_allocation(pod)
        if errors and not (pod.get("spec") or {}).get("nodeName"):
            # (not running anywhere: the device plugin refuses such a grant, nothing is held)
            log.warning("pod %s: %s; its grant is left out", ref, "; ".join(errors.values()))
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        held = self.ledger.pod(key)
        if (
            key in self._final
            and held is not None
            and not self.ledger.is_reserved(key)
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ):
            # A bound pod's grant is final (HAMi's scheduler, too, keeps the first it saw): the
            # pod's owner may edit its annotations, and a grant rewritten smaller, moved or removed
            # must not free GPUs its containers still hold (nor leave its namespace's quota).
            # What follows the pod's status (init containers done) and its classes still count.
            pending = self.unreadable.get(key)
            if alloc is not None and pending is not None and _extends_grant(alloc, held, pending.errors):
                pass  # the grant of a vendor that could not be read is readable now: it counts too
            elif alloc is None or not _same_grant(alloc, held):
                log.warning(
                    "pod %s: its allocation annotations changed after it was bound; "
                    "the grant it was bound with (node %s) still counts",
                    ref,
                    held.node,
                )
                alloc = make_allocation(pod, held.node, held.devices, held.slices, self.vendors)
        # what of a running pod's grant is neither read now nor held from before
        blind = unreadable_vendors(alloc, errors)
        running = bound and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        if running and blind:
            self._set_unreadable(key, UnreadableGrant(ref, (pod.get("spec") or {})["nodeName"], blind), pod)
        elif key in self.unreadable:
            self._set_unreadable(key, None)
        if bound and alloc is not None:
            self._final.add(key)  # (a bound pod's allocation always lands in the ledger below)
        if alloc is not None:
            current = self.ledger.pod(key)
            reserved = self.ledger.is_reserved(key)
            same = current is not None and _same_allocation(current, alloc)
            if reserved and not same and not (pod.get("spec") or {}).get("nodeName"):
                return  # our newer decision's patch has not come back yet: keep the reservation
            # (a bound pod's allocation is final: it replaces any reservation, e.g. one this replica
            # made before another replica, now the leader, bound the pod elsewhere)
            if reserved and same and self.ledger.confirm(alloc):
                return  # the decision came back as written: the reservation ends, counts unchanged
            if not same or reserved:
                self.ledger.add_pod(alloc)  # (an identical add also ends the reservation)
        elif not self.ledger.is_reserved(key) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.ledger.remove_pod(key)
            self._final.discard(key)

    def lock_predates(self, node: str, key: str, value: str, owner: Mapping[str, Any]) -> bool:
        """The lock ``key=value`` on ``node`` was seen there before a pod of ``owner``'s name, not
        ``owner``, was deleted: it was the deleted pod's. A name is free again only once its pod is
        gone, so ``owner`` was created after that deletion and could not have written the lock,
        which names pods by name only (HAMi's format). Unknown revisions answer False."""
        seen = self._lock_seen.get((node, key))
        gone = self._gone_names.get(_ref(owner))
        if seen is None or gone is None or seen[0] != value or seen[1] is None:
            return False
        return gone[0] != (owner.get("metadata") or {}).get("uid") and seen[1] < gone[1]

    def _wake_lock_waiters(self, pod: Mapping[str, Any], gone: bool) -> None:
        """A pod that is gone or finished its allocation (bind-phase success/failed) no longer
        needs its node's lock: wake a Bind waiting on that node (a gone owner's lock is taken
        over at once; a finished one's after the plugin's release, or a short grace without it)."""
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if not gone and annotations.get(BIND_PHASE) not in DONE_PHASES:
            return
        node = (pod.get("spec") or {}).get("nodeName") or annotations.get(VGPU_NODE)
        if node:
            self._wake(node)
        if self._pod_finished is not None:
            self._pod_finished.set()
            self._pod_finished = None

    async def pod_finished(self, timeout: float) -> None:
        """Wait until some pod finishes its allocation or goes away (or ``timeout``)."""
        if self._pod_finished is None:
            self._pod_finished = asyncio.Event()
        try:
            await asyncio.wait_for(self._pod_finished.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def put_pod(self, pod: dict) -> None:
        """Apply a pod object we just wrote (or read), unless the cache already has a newer one."""
        self.apply_pod("MODIFIED", pod)

    def pod(self, namespace: str, name: str) -> dict | None:
        return self.pods.get(f"{namespace}/{name}")

    def restore_pod(self, key: str, namespace: str, name: str) -> None:
        """Make the ledger match the cached pod again (after a failed decision patch)."""
        self.ledger.remove_pod(key)
        cached = self.pod(namespace, name)
        if cached is not None and pod_key(cached) == key:
            self.apply_pod("MODIFIED", cached)

    # ------------------------------------------------------------------ quotas
    @property
    def quota_handler(self) -> "_Handler":
        return _Handler(self._replace_quotas, self._apply_quota)

    def _replace_quotas(self, items: list[dict], resource_version: str | None = None) -> None:
        for ref in list(self.quotas):
            ns, name = ref.split("/", 1)
            self.ledger.remove_quota(ns, name)
        self.quotas.clear()
        for q in items:
            self._apply_quota("MODIFIED", q)

    def _apply_quota(self, kind: str, quota: dict) -> None:
        meta = quota.get("metadata") or {}
        ns, name = meta.get("namespace") or "default", meta.get("name") or ""
        if kind == "DELETED":
            self.quotas.pop(f"{ns}/{name}", None)
            self.ledger.remove_quota(ns, name)
            return
        self.quotas[f"{ns}/{name}"] = quota
        try:
            self.ledger.set_quota(ns, name, (quota.get("spec") or {}).get("hard") or {}, self.vendors)
        except CoreError as exc:  # a value that cannot be read: its key is left out, the rest apply
            log.warning("ignoring %s", exc)

    # ------------------------------------------------------------------ DRA claims and slices
    @property
    def claim_handler(self) -> "_Handler":
        return _Handler(self._replace_claims, self._apply_claim)

    def _replace_claims(self, items: list[dict], resource_version: str | None = None) -> None:
        keep = {_ref(c) for c in items}
        # every claim counted anywhere: one that only a GPU count quota counts (not allocated, and
        # asking no memory or cores a size is known for, say a MIG class's) stayed charged after a
        # relist that no longer had it (deleted while the watch was down; review, 1 Dec)
        known = dict.fromkeys([*self.claims, *self.waiting_claims, *self.claim_device_counts])
        for ref in known:
            if ref not in keep:
                self.claims.pop(ref, None)
                self.waiting_claims.pop(ref, None)
                self.claim_device_counts.pop(ref, None)
                self._claim_uids.pop(ref, None)
                self.ledger.remove_claim(ref)
        for c in items:
            self._apply_claim("MODIFIED", c)

    def _apply_claim(self, kind: str, claim: dict) -> None:
        """A ResourceClaim event: an allocation of driver gpu.hami.io counts against its
        namespace's quota (the ledger) and shows in the UI; a claim asking for its GPUs and not
        allocated (yet, or any more, unless it is being deleted) counts what it asks, as
        Kubernetes' own quota counts claims from their creation (counting allocated claims only
        let claims created together all pass the webhook, kube-scheduler allocating without any
        quota); anything else is dropped."""
        ref = _ref(claim)
        usage = ask = None
        if kind != "DELETED":
            self._claim_seen(ref, claim)
            try:
                usage = claim_usage(claim)
                ask = claim_ask(claim, sizes=self.claim_sizes()) if usage is None and not _deleting(claim) else None
            except ClaimError as exc:
                log.warning("%s; the claim is counted as holding nothing", exc)
        self.claims.pop(ref, None)
        self.waiting_claims.pop(ref, None)
        self.claim_device_counts.pop(ref, None)
        if kind != "DELETED" and not (usage is None and _deleting(claim)):
            try:
                devices, _ = claim_devices(claim)
            except CoreError as exc:
                log.warning("%s; the claim counts no GPUs against a GPU count quota", exc)
                devices = 0
            if devices:
                self.claim_device_counts[ref] = devices
        if usage is not None:
            self.claims[ref] = usage
            self._count_claim(usage)
        elif ask is not None and not ask.unbounded and (ask.memory_mib or ask.cores):
            self.waiting_claims[ref] = (ask.memory_mib, ask.cores)
            namespace = ref.split("/", 1)[0]
            self.ledger.set_claim(ref, namespace, self.dra_vendor, ask.memory_mib, ask.cores)
        else:
            self.ledger.remove_claim(ref)
        if kind == "DELETED" or (usage is None and ref not in self.waiting_claims):
            self._claim_uids.pop(ref, None)

    def claim_sizes(self) -> dict[str, int]:
        """Class -> the MiB a device of it counts when a claim names no memory amount, until it is
        allocated: the largest published (:func:`hami.dra.claims.class_sizes`). A claim waiting
        for allocation keeps the size counted when its last event arrived."""
        if self._class_sizes is None:
            self._class_sizes = class_sizes(self.dra_devices.values())
        return self._class_sizes

    def pod_room(self, namespace: str, vendors: Any) -> Any:
        """The ledger's quota room for ``namespace``, with :meth:`claim_sizes` (a pod the DRA front
        end translates is checked for what its claims will ask)."""
        room = self.ledger.quota_room(namespace, vendors)
        if room is None or not self.dra_devices:
            return room
        return dataclasses.replace(room, claim_sizes=self.claim_sizes())

    def gpu_count_room(self, namespace: str) -> int | None:
        """The GPUs ``namespace`` may still be given under its ResourceQuotas' ``nvidia.com/gpu``
        count limits (None: no such limit): each limit less what the API server counted against
        it less the devices its claims of this driver hold or ask (a pod the DRA front end
        translates asks for no ``nvidia.com/gpu``, so the API server's own count misses them;
        review, 1 Dec); the limit is the configured count resource's (:attr:`count_resource`),
        and scoped quotas are left out (:func:`hami.webhook.admission.gpu_count_room`). Claims
        admitted within the last moments and not yet seen by the watch are not counted here;
        Kubernetes' own quota on
        ``gpu.hami.io.deviceclass.resource.k8s.io/devices`` counts them at creation
        (docs/dra.md)."""
        prefix = namespace + "/"
        held = sum(n for ref, n in self.claim_device_counts.items() if ref.startswith(prefix))
        quotas = [q for ref, q in self.quotas.items() if ref.startswith(prefix)]
        return gpu_count_room(quotas, namespace, self.count_resource, held)

    @property
    def count_resource(self) -> str:
        """The configured count resource of the vendor whose quota claims count against
        (``resources.count``: ``nvidia.com/gpu`` unless renamed), as the webhook's message names it;
        before 1 Dec ``nvidia.com/gpu`` was read whatever the configuration (review)."""
        vendor = next((v for v in self.vendors if v.name == self.dra_vendor), None)
        count = getattr(getattr(vendor, "resources", None), "count", "") if vendor is not None else ""
        return count or "nvidia.com/gpu"

    def claim_room(self, namespace: str, vendors: Any) -> Any:
        """The quota room a ResourceClaim's admission sees: the ledger's, less what this replica's
        webhook admitted in the last :data:`ADMITTED_CLAIM_TTL` seconds that no watch event has
        shown yet (so claims created at the same moment see each other). Only the claim check
        counts those admissions: a review that never became a claim (refused by the API server
        after us, or sent by anyone who can reach the webhook port, which the API server does not
        authenticate to) delays other claims of its namespace by that long, and as long as it
        is sent again (docs/dra.md: restrict the port), never pods nor Filter."""
        room = self.pod_room(namespace, vendors)
        mem = cores = 0
        for a_ns, _, _, (a_mem, a_cores), _ in self._admitted.values():
            if a_ns == namespace:
                mem, cores = mem + a_mem, cores + a_cores
        if room is None or not (mem or cores) or self.dra_vendor not in room.room:
            return room
        left_mem, left_cores = room.room[self.dra_vendor]
        less = (None if left_mem is None else left_mem - mem, None if left_cores is None else left_cores - cores)
        return dataclasses.replace(room, room={**room.room, self.dra_vendor: less})

    def admit_claim(self, claim: Mapping[str, Any], now: float, vendors: Any) -> None:
        """The webhook has just allowed ``claim`` (not a dry run) in a namespace with a GPU quota:
        what it asks counts in :meth:`claim_room` at once, until the claim's own watch event
        arrives (then it counts as that claim, in the ledger) or :data:`ADMITTED_CLAIM_TTL`
        passes. The name may still be empty (``generateName``: the API server names the claim
        after admission)."""
        self.expire_admitted(now)
        try:
            ask = claim_ask(claim, sizes=self.claim_sizes())
        except ClaimError:
            return
        if ask is None or ask.unbounded or not (ask.memory_mib or ask.cores):
            return
        meta = claim.get("metadata") if isinstance(claim.get("metadata"), Mapping) else {}
        ns = _text(meta.get("namespace")) or "default"
        room = self.ledger.quota_room(ns, vendors)
        if room is None or room.room.get(self.dra_vendor, (None, None)) == (None, None):
            return  # no quota to count against
        mine = [k for k, a in self._admitted.items() if a[0] == ns]
        if len(mine) >= ADMITTED_PER_NAMESPACE:
            del self._admitted[mine[0]]  # the oldest (a flood of reviews: keep memory bounded)
        self._admitted_seq += 1
        self._admitted[self._admitted_seq] = (
            ns,
            _text(meta.get("name")),
            _text(meta.get("generateName")),
            (ask.memory_mib, ask.cores),
            now + ADMITTED_CLAIM_TTL,
        )

    def expire_admitted(self, now: float) -> None:
        for key in [k for k, a in self._admitted.items() if a[4] <= now]:
            del self._admitted[key]

    def _claim_seen(self, ref: str, claim: Mapping[str, Any]) -> None:
        """A claim's watch event: the first time this claim (by uid) is seen, the admission it
        answers stops counting (same namespace and ask; its own name, else the generateName it
        was made from, the longest such prefix first); the claim counts itself from now on."""
        meta = claim.get("metadata") if isinstance(claim.get("metadata"), Mapping) else {}
        uid = _text(meta.get("uid"))
        if self._claim_uids.get(ref) == uid and uid:
            return
        self._claim_uids[ref] = uid
        if not self._admitted:
            return
        ns, name = _text(meta.get("namespace")) or "default", _text(meta.get("name"))
        try:
            ask = claim_ask(claim, sizes=self.claim_sizes())
        except ClaimError:
            return
        if ask is None:
            return
        want = (ask.memory_mib, ask.cores)
        best, best_len = None, -1
        for key, (a_ns, a_name, a_prefix, a_ask, _) in self._admitted.items():
            if a_ns != ns or a_ask != want:
                continue
            if a_name:
                if a_name == name:
                    best, best_len = key, len(name) + 1  # an exact name beats any prefix
                    break
            elif a_prefix and name.startswith(a_prefix) and len(a_prefix) > best_len:
                best, best_len = key, len(a_prefix)
        if best is not None:
            del self._admitted[best]

    def _count_claim(self, usage: ClaimUsage) -> None:
        mem, cores = usage.totals(self._dra_totals)
        self.ledger.set_claim(usage.key, usage.namespace, self.dra_vendor, mem, cores)

    @property
    def slice_handler(self) -> "_Handler":
        return _Handler(self._replace_slices, self._apply_slice)

    def _replace_slices(self, items: list[dict], resource_version: str | None = None) -> None:
        self.slices, self._slice_keys, self.dra_devices, self._dra_totals = {}, {}, {}, {}
        self._class_sizes = None
        for s in items:
            self._apply_slice("MODIFIED", s, recount=False)
        self._recount_whole_device_claims(None)

    def _apply_slice(self, kind: str, obj: dict, recount: bool = True) -> None:
        """One slice's devices replace what it published before (the others are not re-read). A
        field of the wrong type is read as missing (:func:`hami.dra.claims.slice_devices`)."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        name = meta.get("name") if isinstance(meta.get("name"), str) else ""
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        self._class_sizes = None
        for key in self._slice_keys.pop(name, ()):
            self.dra_devices.pop(key, None)
            self._dra_totals.pop(key, None)
        if kind == "DELETED" or spec.get("driver") != DRA_DRIVER:
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
            devices = slice_devices([obj])
            self._slice_keys[name] = tuple(devices)
            self.dra_devices.update(devices)
            self._dra_totals.update((k, d["total"]) for k, d in devices.items())
        if recount:
            pool = spec.get("pool") if isinstance(spec.get("pool"), Mapping) else {}
            named = {v for v in (spec.get("nodeName"), pool.get("name")) if isinstance(v, str)}
            self._recount_whole_device_claims({node for node, _ in self._slice_keys.get(name, ())} | named)

    def device_node_names(self) -> list[str]:
        """Nodes with devices on either front end: registered ones and those with DRA GPUs."""
        return sorted(set(self.ledger.node_names()) | {node for node, _ in self.dra_devices})

    def _recount_whole_device_claims(self, nodes: set[str] | None) -> None:
        """Devices changed (on ``nodes``; None: anywhere): a claim that took a whole device (no
        consumedCapacity recorded) is counted anew from the device's size."""
        for usage in self.claims.values():
            if any(None in (r.memory, r.cores) and (nodes is None or r.pool in nodes) for r in usage.results):
                self._count_claim(usage)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _deleting(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def _same_allocation(a: Any, b: Any) -> bool:
    """Same placement (decoded annotations carry no device index, so compare what they say),
    held by a pod of the same classes (MetaX sGPU's app class, which the pod's owner may edit)."""
    return (a.node, a.kinds, a.usage, a.classes) == (b.node, b.kinds, b.usage, b.classes) and {
        v: [[d.uuid for d in c] for c in per] for v, per in a.devices.items()
    } == {v: [[d.uuid for d in c] for c in per] for v, per in b.devices.items()}


def _same_grant(a: Any, b: Any) -> bool:
    """Same node, the same devices with the same memory and cores per container, same slices."""
    return (a.node, tuple(a.slices)) == (b.node, tuple(b.slices)) and {
        v: [[(d.uuid, d.type, d.usedmem, d.usedcores) for d in c] for c in per] for v, per in a.devices.items()
    } == {v: [[(d.uuid, d.type, d.usedmem, d.usedcores) for d in c] for c in per] for v, per in b.devices.items()}


def _extends_grant(a: Any, held: Any, vendors: Iterable[str]) -> bool:
    """``a`` is the grant ``held`` plus that of some of ``vendors`` (whose grants could not be
    read when ``held`` was), the rest unchanged."""
    added = set(a.devices) - set(held.devices)
    return (
        bool(added)
        and added <= set(vendors)
        and set(held.slices) <= set(a.slices)
        and _same_grant(
            dataclasses.replace(
                a, devices={v: a.devices[v] for v in held.devices if v in a.devices}, slices=held.slices
            ),
            held,
        )
    )


def _ref(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, a missing part empty (as :class:`hami.dra.claims.ClaimUsage` keys a claim)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _remember(deleted: dict[str, None], uid: str | None) -> None:
    """Add ``uid`` to a bounded record of deleted objects (the oldest forgotten first)."""
    if uid:
        deleted.pop(uid, None)
        deleted[uid] = None
        while len(deleted) > TOMBSTONES:
            del deleted[next(iter(deleted))]


def _not_older(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """``new`` is at least as recent as ``old``; unknown/non-numeric versions are accepted."""
    a, b = revision(new), revision(old)
    return a is None or b is None or a >= b


class _Handler:
    def __init__(self, replace, apply) -> None:
        self.replace = replace
        self.apply = apply
