"""Which of the DRA front end's ResourceClaimTemplates the webhook created a moment ago.

The DRA front end names a template after its content (:func:`hami.dra.translate.translate`), so
pods of one shape share one template per namespace. Creating it at every admission cost a POST
per pod (answered 409 after the first) in the pod's create path. :class:`KnownTemplates` remembers
a template that was created, or found to exist, for ``TTL_S`` seconds; the server skips the POST
while it is remembered. The decisions are pure (``now`` is passed in); the server does the I/O.

The window this leaves: a remembered template deleted by hand (or its namespace deleted and
made again under the same name) within ``TTL_S`` of the last admission that needed it. A pod
admitted then names a template that is gone; kube-controller-manager retries creating its claim,
and the next admission after the entry expires creates the template again.
"""

from __future__ import annotations

TTL_S = 30.0
MAX_ENTRIES = 4096  # namespaces x pod shapes; the oldest are forgotten first beyond this


class KnownTemplates:
    """(namespace, template name) pairs known to exist, each until its expiry time."""

    def __init__(self, ttl: float = TTL_S, max_entries: int = MAX_ENTRIES) -> None:
        if ttl < 0 or max_entries < 1:
            raise ValueError(f"KnownTemplates: ttl must be >= 0 and max_entries >= 1, got {ttl!r}, {max_entries!r}")
        self.ttl = ttl
        self.max_entries = max_entries
        self._until: dict[tuple[str, str], float] = {}

    def known(self, namespace: str, name: str, now: float) -> bool:
        """True while the template was seen to exist less than ``ttl`` seconds before ``now``."""
        until = self._until.get((namespace, name))
        if until is None:
            return False
        if now >= until:
            del self._until[(namespace, name)]
            return False
        return True

    def exists(self, namespace: str, name: str, now: float) -> None:
        """The template was just created, or its create answered 409 (it exists)."""
        key = (namespace, name)
        self._until.pop(key, None)  # re-inserted last: the dict's order is the order of expiry
        self._until[key] = now + self.ttl
        while len(self._until) > self.max_entries:
            del self._until[next(iter(self._until))]

    def forget(self, namespace: str, name: str) -> None:
        self._until.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._until)


# ---------------------------------------------------------------------- creation budget
#
# The webhook's port is open to anyone who reaches it (the API server does not authenticate
# itself to webhooks), and a template is named after its content: a caller who varies the
# request (gpumem 1000, 1001, ...) could have the scheduler create templates without end. The
# server creates a template only in a namespace that exists and is not terminating, and only
# while a budget allows: per namespace ``burst`` new templates at once, then one every
# ``1/per_s`` seconds, and over all namespaces ``total_burst``, then ``total_per_s`` a second.
# A create answered 409 (it existed) or refused by the API server gives its token back; a
# template this process saw exist in the last ``SEEN_TTL_S`` needs none (a pod of a shape in
# use is never refused for a flood of new shapes). Real workloads use a handful of shapes per
# namespace; a hard bound on what exists is a ResourceQuota on
# ``count/resourceclaimtemplates.resource.k8s.io``, which the API server applies to our creates.

BURST = 32
PER_S = 1 / 5
TOTAL_BURST = 128
TOTAL_PER_S = 1.0
MAX_NAMESPACES = 4096
SEEN_TTL_S = 24 * 3600.0


class TemplateBudget:
    """Token buckets for template creates, one per namespace and one over all of them."""

    def __init__(
        self,
        burst: float = BURST,
        per_s: float = PER_S,
        total_burst: float = TOTAL_BURST,
        total_per_s: float = TOTAL_PER_S,
        max_namespaces: int = MAX_NAMESPACES,
    ) -> None:
        if min(burst, total_burst) < 1 or min(per_s, total_per_s) <= 0 or max_namespaces < 1:
            raise ValueError(
                "TemplateBudget: bursts must be >= 1, rates > 0 and max_namespaces >= 1, got "
                f"{burst!r}, {per_s!r}, {total_burst!r}, {total_per_s!r}, {max_namespaces!r}"
            )
        self.burst, self.per_s = float(burst), float(per_s)
        self.total_burst, self.total_per_s = float(total_burst), float(total_per_s)
        self.max_namespaces = max_namespaces
        self._total = (self.total_burst, 0.0)  # (tokens, when counted)
        self._ns: dict[str, tuple[float, float]] = {}

    @staticmethod
    def _level(bucket: tuple[float, float], now: float, burst: float, rate: float) -> float:
        tokens, at = bucket
        return min(burst, tokens + max(0.0, now - at) * rate)

    def take(self, namespace: str, now: float) -> bool:
        """One create in ``namespace`` at ``now``: True (a token is spent) or False (over budget)."""
        ns = self._level(self._ns.pop(namespace, (self.burst, now)), now, self.burst, self.per_s)
        total = self._level(self._total, now, self.total_burst, self.total_per_s)
        ok = ns >= 1 and total >= 1
        if ok:
            ns, total = ns - 1, total - 1
        self._ns[namespace] = (ns, now)  # re-inserted last: the dict's order is the order of use
        self._total = (total, now)
        while len(self._ns) > self.max_namespaces:  # a namespace forgotten starts full again
            del self._ns[next(iter(self._ns))]
        return ok

    def give_back(self, namespace: str, now: float) -> None:
        """A token taken for a create that created nothing (409, or refused)."""
        if namespace in self._ns:
            level = self._level(self._ns[namespace], now, self.burst, self.per_s)
            self._ns[namespace] = (min(self.burst, level + 1), now)
        total = self._level(self._total, now, self.total_burst, self.total_per_s)
        self._total = (min(self.total_burst, total + 1), now)

    def __len__(self) -> int:
        return len(self._ns)
