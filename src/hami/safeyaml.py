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
