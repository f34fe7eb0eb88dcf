"""Griffe extension for the docs site: the Sphinx markup of rankwise's docstrings as Markdown.

rankwise's docstrings read well in ``help()`` and in an editor, so they use the usual reST roles:
``:func:`soft_rank```, ``:class:`~rankwise.data.DataFormatError```, ``:math:`\\tau```, and
``.. math::`` blocks. mkdocstrings renders docstrings as Markdown, so before rendering this
extension turns

* ``:math:`x``` into inline math ``\\(x\\)`` and a ``.. math::`` block into a ``$$ ... $$`` block
  (both typeset by MathJax through ``pymdownx.arithmatex``);
* ``>>>`` examples into ``pycon`` code blocks;
* ``:func:`` / ``:class:`` / ``:meth:`` / ``:mod:`` / ``:data:`` / ``:attr:`` / ``:exc:`` / ``:obj:``
  into a code span linked to the object's reference entry when there is one (an *optional*
  cross-reference: a name without an entry, e.g. a private helper, stays plain code).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_XREF = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
_MATH = re.compile(r":math:`([^`]*)`")
_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")  # a Google-style section title ("Example:")
_MATH_BLOCK = re.compile(r"^(\s*)\.\. math::[ \t]*(.*)$")


def _math_blocks(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _MATH_BLOCK.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, first = m.group(1), m.group(2).strip()
        body = [first] if first else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        while body and not body[0]:
            body.pop(0)
        if out and out[-1].strip():
            out.append("")
        out += [f"{indent}$$", *(f"{indent}{b}" for b in body if b), f"{indent}$$", ""]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _fence_examples(text: str) -> str:
    """Fence each run of ``>>>`` lines and their output as a ``pycon`` code block (as in ``help()``)."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][: len(lines[i]) - len(stripped)]
        block = []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].strip())
            i += 1
        if out and out[-1].strip() and not _SECTION.match(out[-1]):  # a blank line would end the section
            out.append("")
        out += [f"{indent}```pycon", *(f"{indent}{b}" for b in block), f"{indent}```"]
    return "\n".join(out)


def _resolve(obj: griffe.Object, target: str) -> str:
    name = target.rstrip("()")
    try:
        return obj.resolve(name)
    except Exception:  # a dotted or external name: use it as written
        return name


def convert(text: str, obj: griffe.Object) -> str:
    """The Markdown form of one docstring of ``obj`` (names resolved in its scope)."""
    parts = re.split(r"(^[ \t]*```pycon\n.*?^[ \t]*```$)", _fence_examples(text), flags=re.M | re.S)
    return "".join(p if p.lstrip().startswith("```pycon") else _convert_prose(p, obj) for p in parts)


def _convert_prose(text: str, obj: griffe.Object) -> str:
    text = _math_blocks(text)
    text = _MATH.sub(lambda m: "\\(" + m.group(1) + "\\)", text)

    def xref(m: re.Match[str]) -> str:
        tilde, target = m.group(1), m.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if tilde else target
        return f'<autoref identifier="{_resolve(obj, target)}" optional><code>{shown}</code></autoref>'

    return _XREF.sub(xref, text)


def _walk(obj: griffe.Object, seen: set[str]) -> Any:
    if obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield from _walk(member, seen)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of the loaded package once it is complete (names resolvable)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg, set()):
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj)
