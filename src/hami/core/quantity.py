"""Reading container resources as Kubernetes serialises them (plain dicts).

Quantities follow Kubernetes' ``resource.Quantity`` grammar, which is what the API server
accepts in ``resources.limits``/``requests``, ResourceQuota ``spec.hard`` and a Node's
``status.capacity``/``allocatable``::

    quantity = [+|-] number suffix
    number   = digits | digits "." [digits] | "." digits          (ASCII digits only)
    suffix   = "" | n | u | m | k | M | G | T | P | E              (decimal SI, 10^-9 .. 10^18)
             | Ki | Mi | Gi | Ti | Pi | Ei                          (binary SI, 2^10 .. 2^60)
             | (e|E) [+|-] digits                                   (decimal exponent)

Surrounding ASCII whitespace is ignored (as the API server's JSON decoding does). A JSON/YAML
number is taken as written: a float by its shortest decimal text (``0.1`` is exactly 1/10, as
Kubernetes parses the number's text, not the binary fraction nearest it), a whole one exactly.
Device resources are counts, so :func:`parse_int_quantity` also requires a whole number that
fits an int64 (HAMi reads them with ``Quantity.AsInt64``); the parse is exact (``0.5Ki`` is
512, ``1500m`` is not whole) and bounded: a huge exponent or thousands of digits is refused
without computing the value.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from fractions import Fraction
from typing import Any, Mapping

from .errors import RequestError

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_QTY = re.compile(
    r"([+-]?)(?:([0-9]+)(?:\.([0-9]*))?|\.([0-9]+))"
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?[0-9]+))?"
)
_WS = " \t\n\r\f\v"
_MAX_DIGITS = 100  # significant digits beyond this cannot make a whole int64 (see _exact)


class QuantityError(RequestError):
    """A value that is not a Kubernetes quantity (or not a whole int64 one)."""


def parse_quantity(value: Any, where: str) -> Fraction:
    """The exact value of a Kubernetes quantity (string, int or finite float). ``where`` names
    the field in the error. Raises :class:`QuantityError`; values beyond +-2^63 are refused."""
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{where}: must be a quantity, got {value!r}")
    if isinstance(value, int):
        return Fraction(_in_range(value, where, value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{where}: must be a finite quantity, got {value!r}")
        if abs(value) >= 2**63:
            raise QuantityError(f"{where}: {_show(value)} is out of range (beyond int64)")
        # the number as written, not the binary fraction nearest it: ``cpu: 0.1`` is 1/10 (100m),
        # as Kubernetes reads the text 0.1, where Fraction(0.1) is a little more (ceil: 101m).
        # repr is the shortest text that reads back as the same float (the written text, up to 15
        # significant digits); a whole float is its exact value, as an int is
        return Fraction(int(value)) if value.is_integer() else Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"{where}: must be a quantity string or number, got {type(value).__name__}")
    text = value.strip(_WS)
    m = _QTY.fullmatch(text) if text.isascii() else None
    if m is None:
        raise QuantityError(f"{where}: {_show(value)} is not a quantity (e.g. 3000, 2k, 1Gi, 1e3, 500m)")
    sign, whole, frac, bare_frac, suffix, exponent = m.groups()
    digits_whole, digits_frac = (whole or "").lstrip("0"), (frac if whole is not None else bare_frac) or ""
    digits_frac = digits_frac.rstrip("0")
    mantissa_text = (digits_whole + digits_frac).lstrip("0")
    if not mantissa_text:
        return Fraction(0)
    stripped = mantissa_text.rstrip("0")
    scale = len(mantissa_text) - len(stripped) - len(digits_frac)
    if exponent is not None:
        exp_text = exponent.lstrip("+-").lstrip("0") or "0"
        if len(exp_text) > 6:  # beyond 10^+-999999: out of range, or a fraction
            raise QuantityError(f"{where}: {_show(value)} is out of range (exponent too large)")
        scale += int(exponent)
    else:
        scale += _DECIMAL.get(suffix or "", 0)
    binary = _BINARY.get(suffix or "", 0)
    if len(stripped) > _MAX_DIGITS or scale + len(stripped) > 40:  # at least 10^39: beyond int64
        raise QuantityError(f"{where}: {_show(value)} is out of range (beyond int64)")
    if scale < -(_MAX_DIGITS + 30):  # below 10^-30: a fraction (whatever its digits)
        return Fraction(-1 if sign == "-" else 1, 10 ** (_MAX_DIGITS + 30))
    magnitude = Fraction(int(stripped)) * Fraction(10) ** scale * 2**binary
    result = -magnitude if sign == "-" else magnitude
    if abs(result) > 2**63:
        raise QuantityError(f"{where}: {_show(value)} is out of range (beyond int64)")
    return result


def _show(value: Any) -> str:
    """``repr(value)``, shortened: an error line stays one readable line."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else f"a {value.bit_length()}-bit number"
    return text if len(text) <= 64 else text[:60] + "...'"


def _in_range(n: int, where: str, shown: Any) -> int:
    if not INT64_MIN <= n <= INT64_MAX:
        raise QuantityError(f"{where}: {_show(shown)} is out of range (beyond int64)")
    return n


@lru_cache(maxsize=4096)
def _whole(text: str) -> int | None:
    """The value of a whole int64 quantity string; None when it is not one (the caller parses
    it again for the error naming its field). A memo: a cluster writes few distinct quantities
    (``"80"``, ``"4000"``, ``"1Gi"``) and reads them on every Filter and node refresh."""
    try:
        q = parse_quantity(text, "")
    except QuantityError:
        return None
    if q.denominator != 1 or not INT64_MIN <= q <= INT64_MAX:
        return None
    return int(q)


def parse_int_quantity(value: Any, where: str) -> int:
    """A whole-number resource quantity (``3000``, ``"3000"``, ``"2k"``, ``"1e3"``, ``"1Gi"``,
    ``"1500m"`` is refused). ``where`` names the field. Raises :class:`QuantityError`."""
    if type(value) is str:
        got = _whole(value)
        if got is not None:
            return got
    elif type(value) is int:
        return _in_range(value, where, value)
    q = parse_quantity(value, where)
    if q.denominator != 1:
        raise QuantityError(f"{where}: must be a whole number, got {_show(value)}")
    return _in_range(int(q), where, value)


def container_resources(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(limits, requests)`` of a container dict, empty mappings when absent."""
    res = container.get("resources") or {}
    return (res.get("limits") or {}), (res.get("requests") or {})


#: what Go's ``strconv.ParseBool`` reads as true: HAMi parses its boolean annotations and
#: environment variables so (``nvidia.com/numa-bind``, ``CUDA_DISABLE_CONTROL``)
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


def go_true(text: object) -> bool:
    """True when ``text`` is true as Go's ``strconv.ParseBool`` reads it (no trimming, no other
    case: ``" true"`` and ``"tRUE"`` are not, ``"1"`` and ``"T"`` are)."""
    return isinstance(text, str) and text in GO_TRUE
