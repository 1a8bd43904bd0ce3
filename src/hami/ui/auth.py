"""Who may read ``/api/v1``: Kubernetes bearer tokens and RBAC, as kube-rbac-proxy and the
Kubernetes Dashboard do it (docs/ui.md, "Signing in and permissions").

- Authentication: the ``Authorization: Bearer <token>`` header of each request is sent to the
  API server in a TokenReview (``authentication.k8s.io/v1``); its ``status.user`` is the caller.
- Authorization: each permission an answer needs (``list pods`` in a namespace, ``list nodes``
  at the cluster scope, ...) is a SubjectAccessReview (``authorization.k8s.io/v1``) for that user.
- Both answers are cached, at most ``MAX_ENTRIES`` of each (least recently used evicted first;
  refused tokens apart, at most ``REFUSED_ENTRIES``, so made-up tokens never evict accepted ones):
  a yes (a token accepted, a permission held) for ``TTL`` seconds, so a revoked token or
  RoleBinding still works for up to that long; a no for ``DENIED_TTL`` seconds, as the API
  server's webhook authorizer keeps its denials shorter than its grants (a tenant who was just
  granted access must not stay refused for the grant's TTL). A token's review is keyed by the
  SHA-256 of the token (the token itself is never stored after the review, logged or used as a
  key), a permission by the user the token
  review named (:func:`identity_key`): the access review is asked of that user, not of the
  token, so tokens naming the same identity share one answer (not a ServiceAccount's: the API
  server names each of its tokens in ``extra``, ``authentication.kubernetes.io/credential-id``). A review that fails (API server unreachable, an error status, an answer that cannot
  be read) raises :class:`ReviewUnavailable` and is never cached: the caller answers 503, never
  a pass.
- With ``audiences`` (``KubeReviews``), the TokenReview asks for them and a review whose
  ``status.audiences`` names none of them is a refusal, as the API server's own webhook
  authenticator does; without, the API server's default audience.
- For a caller without cluster-wide access, the namespaces it may list are kept per caller and
  resource (at most ``VISIBLE_ENTRIES`` callers): one entry a caller, however many namespaces,
  so tenants x namespaces beyond ``MAX_ENTRIES`` do not evict each other's answers and repeat
  every check on each refresh; kept ``DENIED_TTL`` while it allows no namespace, ``TTL`` once
  it allows one (:meth:`Authorizer.namespaces`).
- Load on the API server is bounded whatever callers send: at most ``TOKEN_REVIEWS_IN_FLIGHT``
  token reviews at once (a request past that is answered 503 at once, :class:`ReviewBusy`, so
  unauthenticated callers with fresh random tokens cannot queue reviews without limit; requests
  with a token already being reviewed share that review and take no place), plus
  ``RENEWALS_IN_FLIGHT`` kept for tokens the API server accepted before (their answer's TTL
  ran out), which unknown tokens never take: a flood cannot lock signed-in users out; at
  most ``CONCURRENCY`` access reviews at once over all requests and ``PER_USER`` of one user's
  (by username, :attr:`Caller.user`; authenticated callers wait; one tenant's scan of many namespaces leaves room for the others'
  checks), and at most ``PER_USER + REVIEWS_WAITING_PER_USER`` requests of one user (every
  ServiceAccount of a namespace counting as one user, :func:`token_owner`) in access review at
  once, a scan of many namespaces counting as one: one more is answered 503 at once
  (:class:`AccessReviewsBusy`), so a user's flood of requests each needing a new review holds
  only its own few connections, not the listener's; and at most ``IN_REVIEW_TOTAL`` (half the
  listener's connections) over all users. Requests asking the same permission of the
  same user at once share one review (a page's five answers scanned the same namespaces three
  times).

The reviews go through their own :class:`hami.kube.client.KubeClient` (``UI_CONNECTIONS``
connections, the scheduler's ServiceAccount, which needs ``create`` on both review resources:
the chart grants it), not the pool Filter's and Bind's writes use. Tests pass any object with the
two methods of :class:`Reviews`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Iterator, Protocol, TypeVar

import orjson

from hami.serve import MAX_CONNECTIONS

TTL = 10.0  # s a review's yes is reused (a revoked grant keeps working this long)
#: s a review's no is reused (a new grant is seen this late); a flood of refusals still costs one
#: review per 2 s
DENIED_TTL = 2.0
MAX_ENTRIES = 4096  # answers kept per cache (tokens accepted; access reviews)
#: tokens refused, kept apart: a flood of made-up tokens pushes out only each other, never a
#: signed-in user's accepted token (found by review, 1 Dec: one cache of both let any pod's
#: junk evict every user, whose next request then needed a review slot the flood held)
REFUSED_ENTRIES = 1024
CONCURRENCY = 16  # access reviews in flight at once, over all requests
PER_USER = 4  # access reviews of one user in flight at once (within CONCURRENCY)
#: requests of one user (every ServiceAccount of a namespace counts as one user, as for
#: ACCEPTED_PER_OWNER) that may wait for access reviews beyond PER_USER: at most PER_USER + this
#: many (20) are in review at once and one more is answered 503 at once (:class:`AccessReviewsBusy`).
#: 20 is four tabs' page loads (five answers each) at once; the listener's 512 connections then
#: take 26 users' floods to fill, not one's. Found by review, 1 Dec: the waiters queued without
#: bound, and one tenant's requests for made-up namespaces (each a new review) held every
#: connection the listener allows, so every other user's new connection was closed at accept
REVIEWS_WAITING_PER_USER = 16
#: requests in access review at once over all users: one more is answered 503 at once
#: (:class:`AccessReviewsBusy`). Half the listener's connections (hami.serve.MAX_CONNECTIONS), so
#: a tenant holding many users (ServiceAccounts of many namespaces, self-service namespaces) fills
#: at most half with requests waiting for reviews, and requests answered from the caches (every
#: user who was checked before) and the probes keep the rest. Found by review, 1 Dec: the per-user
#: bound alone let 26 such users hold every connection
IN_REVIEW_TOTAL = MAX_CONNECTIONS // 2
TOKEN_REVIEWS_IN_FLIGHT = 8  # token reviews at once; a request past that is answered 503 at once
#: reviews kept for tokens accepted before (their answer's TTL ran out): they do not count in
#: TOKEN_REVIEWS_IN_FLIGHT, which unknown tokens fill, and are tried first for such a token
RENEWALS_IN_FLIGHT = 4
#: tokens (their SHA-256) remembered as accepted once, for RENEWALS_IN_FLIGHT: only a token the
#: API server accepted gets in, so made-up ones cannot take these slots
ACCEPTED_BEFORE = 4096
#: of which at most this many per owner (a user; every ServiceAccount of a namespace counts as one
#: owner): a tenant minting 4096 valid tokens (TokenRequest for its own ServiceAccounts) pushed
#: every signed-in user out of the list, and past their answer's TTL they met the flood's 503
#: (found by the regression review, 1 Dec)
ACCEPTED_PER_OWNER = 4
VISIBLE_ENTRIES = 1024  # callers whose visible namespaces are kept (one entry per caller and resource)
UI_CONNECTIONS = 4  # the UI's own connections to the API server (reviews, events)
REVIEW_TIMEOUT = 5.0  # s for one review request to the API server
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
MAX_TOKEN = 8192  # bytes; a longer "token" is refused without a review


@dataclass(frozen=True)
class Identity:
    """The caller as the API server's TokenReview named it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Permission:
    """One RBAC check: ``verb`` on ``resource`` (core group) in ``namespace`` ("" = cluster scope)."""

    verb: str
    resource: str
    namespace: str = ""

    def describe(self) -> str:
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        return f"{self.verb} {self.resource} {where}"

    def doc(self) -> dict:
        return {"verb": self.verb, "resource": self.resource, "namespace": self.namespace}


class ReviewUnavailable(Exception):
    """The API server could not answer a review: the request must fail (503), never pass."""


class ReviewBusy(ReviewUnavailable):
    """Too many token reviews in flight: answered 503 at once, nothing is sent."""


class AccessReviewsBusy(ReviewBusy):
    """``PER_USER + REVIEWS_WAITING_PER_USER`` of the user's requests are already in access
    review: answered 503 at once (``Retry-After``, not logged, as :class:`ReviewBusy`), nothing
    is sent."""


class Unauthenticated(Exception):
    """No bearer token, or one the API server does not accept (401)."""

    def __init__(self, message: str, invalid: bool) -> None:
        super().__init__(message)
        self.invalid = invalid  # a token was given (WWW-Authenticate error="invalid_token")


class Reviews(Protocol):
    async def token(self, token: str) -> Identity | None:
        """The user of ``token``, None when not authenticated; :class:`ReviewUnavailable` on failure."""

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        """Whether ``who`` holds ``perm``; :class:`ReviewUnavailable` on failure."""


def _str_list(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


class KubeReviews:
    """:class:`Reviews` over the API server, through the scheduler's KubeClient."""

    def __init__(self, kube: Any, timeout: float = REVIEW_TIMEOUT, audiences: Iterable[str] = ()) -> None:
        self.kube, self.timeout = kube, timeout
        self.audiences = tuple(a for a in audiences if a)  # () = the API server's default audience

    async def _post(self, path: str, body: dict) -> dict:
        from hami.kube.client import KubeError

        try:
            answer = await self.kube.request("POST", path, body=body, timeout=self.timeout)
        except KubeError as exc:
            raise ReviewUnavailable(str(exc)) from exc
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            raise ReviewUnavailable(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - aiohttp's client errors and the like: fail closed
            raise ReviewUnavailable(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        status = answer.get("status") if isinstance(answer, dict) else None
        if not isinstance(status, dict):
            raise ReviewUnavailable(f"POST {path}: the answer has no status")
        return status

    async def token(self, token: str) -> Identity | None:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status = await self._post(TOKENREVIEWS, body)
        user = status.get("user")
        if status.get("authenticated") is not True or not isinstance(user, dict) or not user.get("username"):
            return None
        if self.audiences and not set(_str_list(status.get("audiences"))) & set(self.audiences):
            # a token for another audience (an authenticator that ignored the request, or none
            # of ours accepted): refused, as kube-apiserver's webhook token authenticator does
            return None
        extra = user.get("extra")
        if not isinstance(extra, dict):
            extra = {}
        return Identity(
            username=str(user["username"]),
            uid=str(user.get("uid") or ""),
            groups=_str_list(user.get("groups")),
            extra=tuple(sorted((str(k), _str_list(v)) for k, v in extra.items())),
        )

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        attrs = {"verb": perm.verb, "group": "", "resource": perm.resource}
        if perm.namespace:
            attrs["namespace"] = perm.namespace
        spec: dict[str, Any] = {"user": who.username, "groups": list(who.groups), "resourceAttributes": attrs}
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        status = await self._post(ACCESSREVIEWS, body)
        return status.get("allowed") is True and status.get("denied") is not True


K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """At most ``max_entries`` answers, each for ``ttl`` seconds of ``clock`` (or the ``ttl``
    it was put with); least recently used evicted first."""

    def __init__(self, ttl: float, max_entries: int, clock: Callable[[], float]) -> None:
        self.ttl, self.max_entries, self.clock = ttl, max_entries, clock
        self._data: OrderedDict[K, tuple[float, float, V]] = OrderedDict()  # key -> (put at, ttl, value)

    def get(self, key: K) -> tuple[bool, V | None]:
        hit = self._data.get(key)
        if hit is None:
            return False, None
        if not 0 <= self.clock() - hit[0] < hit[1]:
            del self._data[key]
            return False, None
        self._data.move_to_end(key)
        return True, hit[2]

    def put(self, key: K, value: V, ttl: float | None = None) -> None:
        self._data[key] = (self.clock(), self.ttl if ttl is None else ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def keep_for(self, key: K, ttl: float) -> None:
        """``key``'s answer lives ``ttl`` seconds from when it was put (not from now)."""
        hit = self._data.get(key)
        if hit is not None:
            self._data[key] = (hit[0], ttl, hit[2])

    def __len__(self) -> int:
        return len(self._data)


def token_key(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def identity_key(who: Identity) -> str:
    """What an access review is asked of (user, uid, groups, extra), as one key: equal keys get
    the same answer from the API server whatever token named them."""
    return hashlib.sha256(orjson.dumps([who.username, who.uid, who.groups, who.extra])).hexdigest()


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization`` header; :class:`Unauthenticated` when there is none."""
    if not header:
        raise Unauthenticated("this API needs a Kubernetes bearer token (Authorization: Bearer <token>)", False)
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header is not 'Bearer <token>'", True)
    if len(token) > MAX_TOKEN or any(c.isspace() for c in token):
        raise Unauthenticated("the bearer token is malformed", True)
    return token


@dataclass(frozen=True)
class Caller:
    """An authenticated request: who, its token's key, the key its access answers are cached
    under (``who``: everything the access review is asked of) and the user its fair shares are
    counted by (``user``: the username). ``who`` is one per token for ServiceAccount tokens (the
    API server names each token in ``extra``, ``authentication.kubernetes.io/credential-id``),
    so the per-user limits go by the username: minting tokens (or a tab per token) must not
    multiply them."""

    identity: Identity
    key: str
    who: str = field(default="", compare=False)
    user: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.who:
            object.__setattr__(self, "who", identity_key(self.identity))
        if not self.user:
            object.__setattr__(self, "user", self.identity.username)


def token_owner(username: str) -> str:
    """Whose a token is, for :data:`ACCEPTED_PER_OWNER`: the namespace of a ServiceAccount
    (whoever may create ServiceAccounts there may mint tokens for as many as they like), else
    the username."""
    parts = username.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return f"system:serviceaccounts:{parts[2]}"
    return username


class Authorizer:
    """Authentication and authorization for the UI listener, with the caches (figures above)."""

    def __init__(
        self,
        reviews: Reviews,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = TTL,
        denied_ttl: float = DENIED_TTL,
        max_entries: int = MAX_ENTRIES,
        concurrency: int = CONCURRENCY,
        per_user: int = PER_USER,
        waiting_per_user: int = REVIEWS_WAITING_PER_USER,
        in_review_total: int = IN_REVIEW_TOTAL,
    ) -> None:
        self.reviews = reviews
        self.denied_ttl = min(denied_ttl, ttl)
        self._tokens: TtlCache[str, Identity] = TtlCache(ttl, max_entries, clock)  # accepted
        self._refused: TtlCache[str, None] = TtlCache(self.denied_ttl, min(REFUSED_ENTRIES, max_entries), clock)
        # token keys -> owner (:func:`token_owner`), least recent first; and each owner's keys
        self._accepted_before: OrderedDict[str, str] = OrderedDict()
        self._owner_keys: dict[str, OrderedDict[str, None]] = {}
        self._access: TtlCache[tuple[str, Permission], bool] = TtlCache(ttl, max_entries, clock)
        self._visible: TtlCache[tuple[str, str, str], dict[str, bool]] = TtlCache(ttl, VISIBLE_ENTRIES, clock)
        self.concurrency, self.per_user = concurrency, per_user
        self.in_review_per_user = per_user + waiting_per_user  # requests of one user in review at once
        self._access_gate = asyncio.Semaphore(concurrency)
        self._token_gate = asyncio.Semaphore(TOKEN_REVIEWS_IN_FLIGHT)
        self._renew_gate = asyncio.Semaphore(RENEWALS_IN_FLIGHT)  # for tokens accepted before
        # one user's gate while it has reviews waiting or in flight: [semaphore, how many use it]
        self._user_gates: dict[str, list[Any]] = {}
        # requests in access review (waiting for or holding a review), by token_owner(user)
        self._in_review: dict[str, int] = {}
        self.in_review_total, self._in_review_sum = in_review_total, 0  # over all users
        self._asking: dict[tuple[str, Permission], asyncio.Future] = {}  # reviews in flight, shared
        self._signing_in: dict[str, asyncio.Future] = {}  # token reviews in flight, by token key

    async def authenticate(self, header: str | None) -> Caller:
        token = bearer_token(header)
        key = token_key(token)
        found, who = self._tokens.get(key)
        if not found and self._refused.get(key)[0]:
            found, who = True, None
        if not found:
            # a page's five answers (or two tabs) with a token not yet reviewed share one review:
            # each asked its own, and past TOKEN_REVIEWS_IN_FLIGHT the user's own requests got 503
            task = self._signing_in.get(key)
            if task is None:
                gate = self._gate_for(key)
                await gate.acquire()  # free: taken at once, before any other request runs
                task = self._signing_in[key] = asyncio.ensure_future(self._token_review(token, key, gate))
                task.add_done_callback(lambda _t: self._signing_in.pop(key, None))
            who = await asyncio.shield(task)  # a request that leaves does not cancel it for the others
        if who is None:
            raise Unauthenticated("the bearer token was not accepted by the Kubernetes API server", True)
        return Caller(who, key)

    def _gate_for(self, key: str) -> asyncio.Semaphore:
        """The review slots a token's review takes: a token accepted before tries its own
        (``RENEWALS_IN_FLIGHT``) first, so a flood of unknown tokens holding every other slot
        does not lock signed-in users out each time their answer's TTL runs out; :class:`ReviewBusy`
        when there is no free one."""
        if key in self._accepted_before and not self._renew_gate.locked():
            return self._renew_gate
        if not self._token_gate.locked():
            return self._token_gate
        raise ReviewBusy(f"{TOKEN_REVIEWS_IN_FLIGHT} token reviews already in flight")

    async def _token_review(self, token: str, key: str, gate: asyncio.Semaphore) -> Identity | None:
        """One TokenReview, ``gate`` already taken; its answer cached (ReviewUnavailable is not):
        an accepted token in the accepted cache and remembered as accepted before, a refused
        one in the refused cache only (and forgotten as accepted before)."""
        try:
            who = await self.reviews.token(token)
        finally:
            gate.release()
        if who is None:
            self._refused.put(key, None)
            self._forget_accepted(key)
        else:
            self._tokens.put(key, who)
            self._remember_accepted(key, token_owner(who.username))
        return who

    def _remember_accepted(self, key: str, owner: str) -> None:
        """``key`` accepted (most recent), at most :data:`ACCEPTED_PER_OWNER` per owner and
        :data:`ACCEPTED_BEFORE` in all (the least recent go)."""
        self._forget_accepted(key)
        self._accepted_before[key] = owner
        keys = self._owner_keys.setdefault(owner, OrderedDict())
        keys[key] = None
        while len(keys) > ACCEPTED_PER_OWNER:
            self._forget_accepted(next(iter(keys)))
        while len(self._accepted_before) > ACCEPTED_BEFORE:
            self._forget_accepted(next(iter(self._accepted_before)))

    def _forget_accepted(self, key: str) -> None:
        owner = self._accepted_before.pop(key, None)
        if owner is None:
            return
        keys = self._owner_keys.get(owner)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._owner_keys[owner]

    async def _review(self, caller: Caller, perm: Permission) -> bool:
        gate = self._user_gates.setdefault(caller.user, [asyncio.Semaphore(self.per_user), 0])
        gate[1] += 1
        try:
            async with gate[0], self._access_gate:
                return await self.reviews.allowed(caller.identity, perm)
        finally:
            gate[1] -= 1
            if not gate[1]:
                del self._user_gates[caller.user]

    async def _shared(self, caller: Caller, perm: Permission) -> bool:
        """One review for every request asking it of the same user at once; a request that
        leaves does not cancel it for the others."""
        key = (caller.who, perm)
        task = self._asking.get(key)
        if task is None:
            task = self._asking[key] = asyncio.ensure_future(self._review(caller, perm))
            task.add_done_callback(lambda _t: self._asking.pop(key, None))
        return await asyncio.shield(task)

    @contextmanager
    def _in_review_slot(self, caller: Caller) -> Iterator[None]:
        """One of the caller's requests in access review while inside (however many reviews it
        waits for: a scan of many namespaces is one); :class:`AccessReviewsBusy` at once when
        ``in_review_per_user`` of its user's (by :func:`token_owner`) already are, so one user's
        flood of requests each needing a review waits in its own bounded queue and holds at most
        that many of the listener's connections, or when ``in_review_total`` of all users' are
        (:data:`IN_REVIEW_TOTAL`: many users' floods together hold at most that many)."""
        owner = token_owner(caller.user)
        held = self._in_review.get(owner, 0)
        if held >= self.in_review_per_user:
            raise AccessReviewsBusy(
                f'{held} requests of user "{owner}" are already in access review (at most '
                f"{self.in_review_per_user} at once, {self.per_user} of them reviewed at a time)"
            )
        if self._in_review_sum >= self.in_review_total:
            raise AccessReviewsBusy(
                f"{self._in_review_sum} requests are already in access review, over all users (at most "
                f"{self.in_review_total} at once)"
            )
        self._in_review[owner] = held + 1
        self._in_review_sum += 1
        try:
            yield
        finally:
            self._in_review_sum -= 1
            self._in_review[owner] -= 1
            if not self._in_review[owner]:
                del self._in_review[owner]

    async def allowed(self, caller: Caller, perm: Permission) -> bool:
        found, ok = self._access.get((caller.who, perm))
        if found:
            return bool(ok)
        with self._in_review_slot(caller):
            ok = await self._shared(caller, perm)
        self._access.put((caller.who, perm), ok, None if ok else self.denied_ttl)
        return ok

    async def namespaces(
        self, caller: Caller, verb: str, resource: str, candidates: Iterable[str] | Callable[[], Iterable[str]]
    ) -> set[str] | None:
        """None when ``caller`` may ``verb resource`` in every namespace (checked at the cluster
        scope first), else the candidates where it may, checked one namespace at a time
        (``candidates`` may be a function: called only then, a caller with cluster-wide access
        costs no search for them); the
        answers are kept in one entry for the caller's user (the module docstring): for
        ``denied_ttl`` while it allows none of them (the answer is a 403, which a new grant must
        lift as soon as any other denial), for the TTL of a grant once it allows one (a namespace
        granted later shows up within that TTL; asking every denied namespace again each
        ``denied_ttl`` would cost a tenant that may see one namespace of 1500 another 1499
        reviews a refresh)."""
        if await self.allowed(caller, Permission(verb, resource)):
            return None
        names = sorted(set(candidates() if callable(candidates) else candidates))
        key = (caller.who, verb, resource)
        found, known = self._visible.get(key)
        if not found or known is None:
            known = {}
            self._visible.put(key, known, self.denied_ttl)  # filled in place: its time is the first check's
        new = [ns for ns in names if ns not in known]
        answers: list[bool] = []
        if new:
            with self._in_review_slot(caller):  # the whole scan: one request in review
                answers = await asyncio.gather(*(self._shared(caller, Permission(verb, resource, ns)) for ns in new))
        known.update(zip(new, answers))
        if any(answers):
            self._visible.keep_for(key, self._visible.ttl)
        return {ns for ns in names if known[ns]}
