"""CEL device selectors as kube-scheduler evaluates them (pure; the DRA model's one CEL seam).

A ResourceClaim request and a DeviceClass select devices with CEL expressions over one variable,
``device``, that kube-scheduler's allocator (``k8s.io/dynamic-resource-allocation/cel``) fills
from a ResourceSlice device:

* ``device.driver`` (string) and ``device.allowMultipleAllocations`` (bool, consumable capacity);
* ``device.attributes["<domain>"].<name>``: the device's attributes grouped by domain; a name
  without a domain belongs to the driver's. Values keep their kind: int, bool, string, and
  ``version`` as a semantic version (``.compareTo(semver("8.0.0"))``);
* ``device.capacity["<domain>"].<name>``: each capacity's ``value`` as a Kubernetes quantity
  (``.compareTo(quantity("16Gi"))``);
* a domain the device does not have reads as an empty map; a name the device does not have is
  a runtime error ("no such key"), which ends kube-scheduler's allocation (:class:`CelRuntimeError`).

The expressions are parsed and run by a maintained CEL library, ``common-expression-language``
(Rust's ``cel`` crate; docs/dra.md says why this one). This module adds what Kubernetes adds to
CEL for selectors: the ``quantity`` and ``semver`` libraries (``quantity()``, ``isQuantity()``,
``compareTo``, ``isLessThan``, ``isGreaterThan``, ``add``, ``sub``, ``sign``, ``isInteger``,
``asInteger``, ``asApproximateFloat``; ``semver()``, ``isSemver()``, ``major``, ``minor``,
``patch``), plus the library's string, list, math and set extensions. The library has no opaque
values, so a quantity is a map ``{"__quantity__": "<numerator>/<denominator>"}`` and a version a
map ``{"__semver__": "<major>.<minor>.<patch>[-pre]"}``: ``==`` between two of them is then
Kubernetes' semantic equality.

What it does not do (docs/dra.md, "CEL selectors"): type-check (an expression that returns a
non-bool, or compares an int with a string, fails when it runs, where the API server refuses it
on create), ``cel.bind`` (the library lacks it: refused when compiled), cost limits.

:func:`compile_selector` compiles an expression once per text; :class:`DeviceCel` holds one
device's input and what each selector said of it, so a selector runs once per device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable, Mapping

import cel as _cel
from cel.stdlib import add_stdlib_to_context

from hami.core.quantity import QuantityError, parse_quantity

MAX_EXPRESSION = 10 * 1024  # resource.k8s.io's CELSelectorExpressionMaxLength
QUANTITY_KEY, SEMVER_KEY = "__quantity__", "__semver__"


class CelError(ValueError):
    """A selector that cannot be compiled or that failed on a device."""


class CelCompileError(CelError):
    """The expression does not compile (the API server refuses such a claim on create)."""


class CelRuntimeError(CelError):
    """The expression failed on a device: kube-scheduler's allocator stops with an error."""


# ------------------------------------------------------------------ Kubernetes' quantity and semver


def _quantity(value: Fraction) -> dict[str, str]:
    return {QUANTITY_KEY: f"{value.numerator}/{value.denominator}"}


def _is(value: Any, key: str) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and key in value


def _q(value: Any) -> Fraction:
    if not _is(value, QUANTITY_KEY):
        raise TypeError(f"no such overload: expected a quantity, got {_show(value)}")
    return Fraction(value[QUANTITY_KEY])


def parse_cel_quantity(text: Any) -> Fraction:
    if not isinstance(text, str):
        raise TypeError(f"quantity() takes a string, got {_show(text)}")
    try:
        return parse_quantity(text, "quantity")
    except QuantityError as exc:
        raise ValueError(f"invalid quantity {text!r}: {exc}") from None


_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)
_LOOSE = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")


def parse_semver(text: Any, normalize: bool = False) -> str:
    """``MAJOR.MINOR.PATCH[-pre]`` (build metadata dropped: it takes no part in comparisons).
    ``normalize`` accepts what Kubernetes' ``semver(s, true)`` does: a leading ``v``, missing
    minor or patch (0) and leading zeros."""
    if not isinstance(text, str):
        raise TypeError(f"semver() takes a string, got {_show(text)}")
    m = _SEMVER.fullmatch(text)
    if m is None and normalize and (loose := _LOOSE.fullmatch(text)) is not None:
        core = ".".join(str(int(p or 0)) for p in loose.groups()[:3])
        m = _SEMVER.fullmatch(core + (loose.group(4) or "") + (loose.group(5) or ""))
    if m is None:
        raise ValueError(f"invalid semver {text!r}")
    return ".".join(m.groups()[:3]) + (f"-{m.group(4)}" if m.group(4) else "")


def _version_key(text: str) -> tuple:
    core, _, pre = text.partition("-")
    nums = tuple(int(p) for p in core.split("."))
    if not pre:
        return nums, (1,)  # a release ranks above each of its pre-releases
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return nums, (0, parts)


def _v(value: Any) -> str:
    if not _is(value, SEMVER_KEY):
        raise TypeError(f"no such overload: expected a semver, got {_show(value)}")
    return str(value[SEMVER_KEY])


def _compare(a: Any, b: Any) -> int:
    if _is(a, QUANTITY_KEY):
        x, y = _q(a), _q(b)
        return (x > y) - (x < y)
    if _is(a, SEMVER_KEY):
        s, t = _version_key(_v(a)), _version_key(_v(b))
        return (s > t) - (s < t)
    raise TypeError(f"no such overload: compareTo on {_show(a)}")


def _as_integer(a: Any) -> int:
    value = _q(a)
    if value.denominator != 1 or not -(2**63) <= value < 2**63:
        raise ValueError(f"cannot convert quantity {float(value)!r} to an int64 without loss")
    return int(value)


def _maybe(parse: Callable[..., Any]) -> Callable[..., bool]:
    def check(*args: Any) -> bool:
        try:
            parse(*args)
        except (TypeError, ValueError):
            return False
        return True

    return check


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": lambda s: _quantity(parse_cel_quantity(s)),
    "isQuantity": _maybe(parse_cel_quantity),
    "semver": lambda s, normalize=False: {SEMVER_KEY: parse_semver(s, normalize)},
    "isSemver": _maybe(parse_semver),
    "compareTo": _compare,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "add": lambda a, b: _quantity(_q(a) + (b if isinstance(b, int) else _q(b))),
    "sub": lambda a, b: _quantity(_q(a) - (b if isinstance(b, int) else _q(b))),
    "sign": lambda a: (_q(a) > 0) - (_q(a) < 0),
    "isInteger": lambda a: _q(a).denominator == 1,
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: float(_q(a)),
    "major": lambda a: int(_v(a).split("-")[0].split(".")[0]),
    "minor": lambda a: int(_v(a).split("-")[0].split(".")[1]),
    "patch": lambda a: int(_v(a).split("-")[0].split(".")[2]),
}


def _show(value: Any) -> str:
    if _is(value, QUANTITY_KEY):
        return "a quantity"
    if _is(value, SEMVER_KEY):
        return "a semver"
    return type(value).__name__


# ------------------------------------------------------------------ compiling

#: CEL's own named functions (operators and macros do not show up by name)
_STANDARD = frozenset(
    "size int uint double string bytes bool type dyn duration timestamp matches startsWith endsWith contains "
    "getDate getDayOfMonth getDayOfWeek getDayOfYear getFullYear getHours getMilliseconds getMinutes getMonth "
    "getSeconds".split()
)


def _library_functions() -> frozenset[str]:
    ctx = _cel.Context()
    add_stdlib_to_context(ctx)
    return frozenset(ctx.functions) | _STANDARD | frozenset(FUNCTIONS)


KNOWN_FUNCTIONS = _library_functions()


@lru_cache(maxsize=1)
def _all_functions() -> dict[str, Callable[..., Any]]:
    """The library's extensions and Kubernetes' functions, to hand each context at once."""
    ctx = _cel.Context()
    add_stdlib_to_context(ctx)
    return {**ctx.functions, **FUNCTIONS}


_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'')
_DOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")
_NAMED_DOMAIN = re.compile(r'\bdevice\.(attributes|capacity)\s*\[\s*"([^"\\]*)"\s*\]')
_LITERAL_CALL = re.compile(r'\b(quantity|semver)\(\s*"([^"\\]*)"\s*(?:,\s*(true|false)\s*)?\)')


@dataclass(frozen=True, eq=False)
class Selector:
    """One compiled selector expression, with what of a device it may read (a context without
    the rest is cheaper to build: most of a selector's cost on a device is its input)."""

    expression: str
    program: Any  # cel.Program
    domains: frozenset[str]  # string literals that may be domains: they read as {} on a device without them
    reads: tuple[bool, bool, bool] = (True, True, True)  # attributes, capacity, library functions
    only: frozenset[str] | None = None  # the domains it reads when it names each one it reads; None: all

    @property
    def needs(self) -> tuple[bool, bool, bool, frozenset[str], frozenset[str] | None]:
        return (*self.reads, self.domains, self.only)


@lru_cache(maxsize=4096)
def compile_selector(expression: str) -> Selector:
    """The compiled expression (once per text). Raises :class:`CelCompileError`: a syntax error,
    an expression over 10 KiB, a function the environment does not have (``cel.bind`` among
    them), or a ``quantity("...")`` / ``semver("...")`` literal that does not parse."""
    if not isinstance(expression, str) or not expression.strip():
        raise CelCompileError("the expression is empty")
    if len(expression) > MAX_EXPRESSION:
        raise CelCompileError(f"the expression is {len(expression)} characters long, at most {MAX_EXPRESSION}")
    try:
        program = _cel.compile(expression)
    except (ValueError, RuntimeError) as exc:
        raise CelCompileError(str(exc).replace("Failed to parse expression", "syntax error in", 1)) from None
    for name in program.functions():
        if name == "bind":
            raise CelCompileError("cel.bind() is not available in the CEL library the simulation uses")
        if name[:1].isalpha() and name not in KNOWN_FUNCTIONS:
            raise CelCompileError(f"undeclared reference to function {name!r}")
    for m in _LITERAL_CALL.finditer(expression):
        try:
            if m.group(1) == "quantity":
                parse_cel_quantity(m.group(2))
            else:
                parse_semver(m.group(2), m.group(3) == "true")
        except (TypeError, ValueError) as exc:
            raise CelCompileError(f"{m.group(0)}: {exc}") from None
    literals = {a or b for a, b in _STRING.findall(expression)}
    # a word that is not there cannot be read (a conservative test: a string holding it counts too)
    reads = ("attributes" in expression, "capacity" in expression, bool(set(program.functions()) - _STANDARD))
    named = _NAMED_DOMAIN.findall(expression)
    words = len(re.findall(r"attributes|capacity", expression))
    only = frozenset(domain for _, domain in named) if len(named) == words else None
    return Selector(expression, program, frozenset(s for s in literals if _DOMAIN.fullmatch(s)), reads, only)


# ------------------------------------------------------------------ one device


def _attribute(value: Any) -> Any:
    """A slice attribute (``{"int": 1}``, ``{"version": "1.2.3"}``, ...) as CEL reads it."""
    if not isinstance(value, dict):
        return None
    for kind in ("int", "bool", "string"):
        if kind in value:
            return value[kind]
    if "version" in value:
        try:
            return {SEMVER_KEY: parse_semver(value["version"])}
        except (TypeError, ValueError):
            return value["version"]
    return None


def _amount(value: Any, name: str) -> Fraction:
    if isinstance(value, str) and value.isdigit():  # what slices hold, mostly: parse_quantity's fast path
        return Fraction(int(value))
    return parse_quantity(value, name)


def device_input(
    driver: str,
    doc: Mapping[str, Any],
    extra_domains: frozenset[str] = frozenset(),
    parts: tuple[bool, bool] = (True, True),
    only: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The ``device`` variable for a ResourceSlice device of ``driver``; ``extra_domains`` are added
    as empty maps where the device has none (Kubernetes reads an unknown domain as ``{}``).
    ``parts``: whether to fill in the attributes and the capacities (left empty otherwise);
    ``only``: the domains to fill in (None: all)."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (doc.get("attributes") or {}).items() if parts[0] else ():
        domain, _, short = str(name).rpartition("/")
        if only is not None and (domain or driver) not in only:
            continue
        got = _attribute(value)
        if got is not None:
            attributes.setdefault(domain or driver, {})[short] = got
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in (doc.get("capacity") or {}).items() if parts[1] else ():
        domain, _, short = str(name).rpartition("/")
        if only is not None and (domain or driver) not in only:
            continue
        try:
            amount = _amount((cap or {}).get("value", 0), name)
        except QuantityError:
            continue
        capacity.setdefault(domain or driver, {})[short] = _quantity(amount)
    for domain in extra_domains:
        attributes.setdefault(domain, {})
        capacity.setdefault(domain, {})
    return {
        "driver": driver,
        "allowMultipleAllocations": bool(doc.get("allowMultipleAllocations")),
        "attributes": attributes,
        "capacity": capacity,
    }


def _runtime_message(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"no such key: {exc.args[0] if exc.args else ''}"
    return str(exc).split(". Check that", 1)[0]


#: verdicts of selectors that read no attribute or capacity: (expression, driver, multi) -> verdict
_SHARED: dict[tuple[str, str, bool], bool | CelRuntimeError] = {}


class DeviceCel:
    """One device as selectors see it: its CEL context (built on first use, rebuilt when a
    selector names a domain it lacks) and each selector's verdict, so a selector runs once."""

    def __init__(self, driver: str, doc: Mapping[str, Any]) -> None:
        self.driver, self.doc = driver, doc
        self._contexts: dict[tuple[bool, bool, bool, frozenset[str], frozenset[str] | None], Any] = {}
        self._verdicts: dict[str, bool | CelRuntimeError] = {}

    def _context_for(self, selector: Selector) -> Any:
        """The smallest context that serves ``selector`` among those built, or a new one."""
        a, c, f, d, o = selector.needs
        for (attrs, caps, funcs, domains, only), ctx in self._contexts.items():
            if (attrs or not a) and (caps or not c) and (funcs or not f) and d <= domains:
                if only is None or (o is not None and o <= only):
                    return ctx
        device = device_input(self.driver, self.doc, d, (a, c), o)
        ctx = _cel.Context(variables={"device": device}, functions=_all_functions() if f else None)
        self._contexts[selector.needs] = ctx
        return ctx

    def matches(self, selector: Selector) -> bool:
        """Whether the device satisfies ``selector``; raises :class:`CelRuntimeError` when the
        expression fails on it or returns something other than a bool. A selector that reads
        neither attributes nor capacities (a class's ``device.driver == "..."``) sees the same
        input on every device of a driver, so its verdict is shared between them."""
        if not selector.reads[0] and not selector.reads[1]:
            key = (selector.expression, self.driver, bool(self.doc.get("allowMultipleAllocations")))
            verdict = _SHARED.get(key)
            if verdict is None:
                if len(_SHARED) > 4096:
                    _SHARED.clear()
                verdict = _SHARED[key] = self._evaluate(selector)
        else:
            verdict = self._verdicts.get(selector.expression)
            if verdict is None:
                verdict = self._verdicts[selector.expression] = self._evaluate(selector)
        if isinstance(verdict, CelRuntimeError):
            raise verdict
        return verdict

    def _evaluate(self, selector: Selector) -> bool | CelRuntimeError:
        try:
            got = selector.program.execute(self._context_for(selector))
        except Exception as exc:  # the library raises KeyError, TypeError, ValueError, RuntimeError, ...
            return CelRuntimeError(_runtime_message(exc))
        return (
            got if isinstance(got, bool) else CelRuntimeError(f"the expression returned {type(got).__name__}, not bool")
        )
