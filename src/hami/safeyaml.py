"""YAML from users' files, read defensively: every failure is one :class:`YamlInputError` line
naming the source and the line, never an exception from deep inside the parser.

On top of ``yaml.SafeLoader``: nesting deeper than :data:`MAX_DEPTH` is refused while composing
(before the parser's recursion could run out of stack), integers longer than
:data:`MAX_INT_DIGITS` digits are refused (Python would otherwise stop at its 4300-digit limit
with a ValueError, or spend quadratic time below it), and the loaded documents go through
:func:`hami.core.shape.check_tree` (anchors/aliases may share a subtree, but a recursive alias
or an alias bomb that expands past the size limit is refused).
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from hami.core.errors import CoreError
from hami.core.shape import MAX_DEPTH, ShapeError, check_tree

MAX_INT_DIGITS = 64


class YamlInputError(CoreError):
    """The text is not YAML we accept; the message names the source (and line when known)."""


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits (at most {MAX_INT_DIGITS})", node.start_mark
            )
        return super().construct_yaml_int(node)

    def construct_timestamp_text(self, node: Any) -> str:
        return str(node.value)  # as Kubernetes' YAML-to-JSON does: a timestamp stays its text


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_timestamp_text)


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f" at line {mark.line + 1}" if mark is not None else ""


def load_all(text: str, source: str) -> list[Any]:
    """Every document of ``text`` (None for an empty one). Raises :class:`YamlInputError`."""
    loader = None
    try:
        loader = _Loader(text)
        docs = []
        while loader.check_data():
            docs.append(loader.get_data())
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlInputError(f"{source}: not valid YAML{_where(exc)} ({problem})") from None
    except RecursionError:
        raise YamlInputError(f"{source}: not valid YAML (nested too deeply)") from None
    except ValueError as exc:  # a constructor's own failure (e.g. a timestamp out of range)
        raise YamlInputError(f"{source}: not valid YAML ({str(exc)[:160]})") from None
    except (KeyError, IndexError, TypeError) as exc:  # PyYAML's constructors on a bad explicit tag
        raise YamlInputError(f"{source}: not valid YAML (a tagged value PyYAML cannot read: {exc!r:.120})") from None
    finally:
        if loader is not None:
            loader.dispose()
    for i, doc in enumerate(docs):
        try:
            check_tree(doc, f"document {i + 1}")
        except ShapeError as exc:
            raise YamlInputError(f"{source}: {exc}") from None
    return docs


#: a float as YAML 1.1 (PyYAML) reads one in JSON's syntax: a dot, a signed exponent
_YAML_FLOAT = re.compile(r"-?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?")

#: what PyYAML reads otherwise than libyaml or json: a tab (libyaml takes one where PyYAML
#: refuses it, e.g. indenting JSON), C1 controls and U+FFFE/U+FFFF (json takes them, PyYAML
#: refuses them; NEL inside a JSON string PyYAML folds to a space), a byte order mark past the
#: first character (libyaml skips one at a line's start, PyYAML reads it as text: cat a.yaml b.yaml)
_ODD_CHARS = re.compile("[\t\x7f-\x9f\ufeff\ufffe\uffff]")
#: a JSON surrogate escape: json joins a pair into one character, PyYAML keeps two
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")

#: PyYAML has libyaml (the fast path parses twice; in pure Python that is slower than safeyaml)
_LIBYAML = hasattr(yaml, "CSafeLoader")


class _Refused(Exception):
    """The fast readers met something only this module's pure reader words well (it reads the text again)."""


def _json_int(text: str) -> int:
    if sum(ch.isdigit() for ch in text) > MAX_INT_DIGITS:
        raise _Refused
    return int(text)


def _json_float(text: str) -> float:
    if not _YAML_FLOAT.fullmatch(text):
        raise _Refused  # 1e3: YAML 1.1 reads it as a string, and so must this reader
    return float(text)


def _json_constant(text: str) -> Any:
    raise _Refused  # NaN, Infinity: not JSON, and nothing a Kubernetes object holds


class _CLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser with this module's pure reader's scalar rules (an integer past the digit limit
    is refused, a timestamp stays its text)."""

    def construct_yaml_int(self, node: Any) -> Any:
        if sum(ch.isdigit() for ch in str(node.value)) > MAX_INT_DIGITS:
            raise _Refused
        return super().construct_yaml_int(node)

    def construct_timestamp_text(self, node: Any) -> str:
        return str(node.value)


_CLoader.add_constructor("tag:yaml.org,2002:int", _CLoader.construct_yaml_int)
_CLoader.add_constructor("tag:yaml.org,2002:timestamp", _CLoader.construct_timestamp_text)

_NESTING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_UNNESTING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def fast_docs(text: str) -> list | None:
    """The documents of ``text`` read by C parsers (``kubectl get -o json`` by :mod:`json`, YAML
    by libyaml), or None when that is not possible or the text is not plainly good: the caller
    then reads it with :func:`load_all`, pure Python and about four times slower than libyaml (a
    1000-node, 10,000-pod dump took 25 s to read), which words every refusal. The
    limits are safeyaml's: nesting is counted on libyaml's events before anything is composed
    (its composer recurses in C and would overflow the stack on deep nesting), integers and
    aliases as safeyaml checks them."""
    if _ODD_CHARS.search(text, 1 if text[:1] == "\ufeff" else 0) or _SURROGATE_ESCAPE.search(text):
        return None
    try:
        if text.lstrip()[:1] == "{":
            try:
                docs = [json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)]
            except ValueError:
                docs = None  # not JSON (YAML in flow style, or a mistake safeyaml words)
        else:
            docs = None
        if docs is None:
            if not _LIBYAML:
                return None  # PyYAML without libyaml: nothing faster to try
            depth = 0
            for event in yaml.parse(text, Loader=_CLoader):
                if getattr(event, "tag", None) is not None:
                    return None  # an explicit tag (no dump has one): libyaml and PyYAML differ on some (!)
                if isinstance(event, _NESTING):
                    depth += 1
                    if depth >= MAX_DEPTH:  # safeyaml counts the scalars inside too
                        return None
                elif isinstance(event, _UNNESTING):
                    depth -= 1
            docs = list(yaml.load_all(text, Loader=_CLoader))
        for i, doc in enumerate(docs):
            check_tree(doc, f"document {i + 1}", max_depth=MAX_DEPTH - 1)
    except (_Refused, yaml.YAMLError, ShapeError, ValueError, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - whatever else (KeyError from !!bool abc): safeyaml's to word
        return None
    return docs


def load_all_fast(text: str, source: str) -> list[Any]:
    """What :func:`load_all` reads, by the C readers of :func:`fast_docs` where they agree with it
    (a big ``kubectl get -o yaml`` dump in a third of the time), else by :func:`load_all`."""
    docs = fast_docs(text)
    return docs if docs is not None else load_all(text, source)


def load(text: str, source: str) -> Any:
    """The single document of ``text`` (None when empty). Raises :class:`YamlInputError`."""
    docs = load_all(text, source)
    if len(docs) > 1:
        raise YamlInputError(f"{source}: expected one YAML document, found {len(docs)}")
    return docs[0] if docs else None


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as UTF-8 text; the error names the byte offset of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlInputError(
            f"{source}: not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
