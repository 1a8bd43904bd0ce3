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
