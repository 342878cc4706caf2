"""A Griffe extension that turns the Sphinx roles in stejax's docstrings into Markdown mkdocstrings renders.

The docstrings are Google style but write math and cross-references the Sphinx way, so that they read well
in ``help()`` and in an editor. Before mkdocstrings parses a docstring, this rewrites:

- ``:math:`x``` to ``$x$`` and a ``.. math::`` directive to one ``$$ ... $$`` block per equation (paragraph),
  which ``pymdownx.arithmatex`` hands to MathJax;
- ``:func:`name```, ``:class:``, ``:meth:``, ``:attr:``, ``:data:``, ``:mod:``, ``:exc:`` and ``:obj:`` to a
  link when the name resolves to an object the site documents, and to plain code when it does not (an
  optional autorefs reference: an unresolved one is not a warning, so ``jax.grad`` may be named freely).

``mkdocs.yml`` loads it by path in the Python handler's ``extensions``. It also makes the explicit re-exports public.
"""

from __future__ import annotations

import ast
import html
import re

import griffe

_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_XREF_ROLE = re.compile(r":(?:py:)?(func|class|meth|attr|data|mod|exc|obj):`(~?)([^`<>]+?)`")
_MATH_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)$")


def _resolve(obj: griffe.Object | griffe.Alias, name: str) -> str | None:
    """The canonical path of ``name`` seen from ``obj``'s scopes (itself, its class, module, packages), or None.

    The canonical path (where the object is defined) is what mkdocstrings registers beside the public path of
    every object it renders, so a name imported into a private module still links to the public page.
    """
    if name.startswith("stejax."):
        return name
    scope: griffe.Object | griffe.Alias | None = obj
    while scope is not None:
        try:
            return scope[name].canonical_path
        except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            scope = scope.parent
    return None


def _xref(obj: griffe.Object | griffe.Alias, match: re.Match[str]) -> str:
    kind, short, name = match.group(1), match.group(2), match.group(3).strip()
    title = name.rsplit(".", 1)[-1] if short else name
    if kind in ("func", "meth"):
        title += "()"
    code = f"<code>{html.escape(title)}</code>"
    path = _resolve(obj, name)
    if path is None:
        return code
    return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'


def _math_directives(text: str) -> str:
    """``.. math::`` directives (content on the same line and/or an indented block) as ``$$`` blocks."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _MATH_DIRECTIVE.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        indent = match.group("indent")
        body = [match.group("first")] if match.group("first").strip() else []
        i += 1
        # The directive's content: every following line indented deeper than it, or blank.
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        while body and not body[0]:
            body.pop(0)
        equations: list[list[str]] = [[]]
        for line in body:
            if line:
                equations[-1].append(line)
            elif equations[-1]:
                equations.append([])
        for equation in equations:
            out += [f"{indent}$$", *(f"{indent}{line}" for line in equation), f"{indent}$$", ""]
    return "\n".join(out)


_PARAM_SECTION = re.compile(
    r"^(?P<indent>[ \t]*)(Args|Arguments|Parameters|Attributes|Keyword Args|Other Parameters):\s*$"
)
_NAMES = r"\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*"
_SHARED_ITEM = re.compile(rf"^(?P<names>{_NAMES}\s*,\s*\*{{0,2}}\w+)(?P<rest>\s*(\([^)]*\))?:(\s.*)?)$")
_NAMES_CONTINUED = re.compile(rf"^{_NAMES}\s*,\s*$")


def _shared_params(text: str) -> str:
    """Napoleon's ``a, b: text`` (one description for several parameters) as one item per name.

    Griffe's Google parser reads one name per item; Sphinx's Napoleon, which the docstrings were written for,
    reads a comma-separated list (which may wrap onto the next line before its colon).
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        section = _PARAM_SECTION.match(lines[i])
        i += 1
        if section is None:
            continue
        item_indent = None
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(section.group("indent") + " ")):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            if line.strip() and item_indent is None:
                item_indent = indent
            if not line.strip() or indent != item_indent:
                out.append(line)
                i += 1
                continue
            head = line.strip()
            j = i + 1
            while _NAMES_CONTINUED.match(head) and j < len(lines) and lines[j].strip():
                head += " " + lines[j].strip()
                j += 1
            match = _SHARED_ITEM.match(head)
            if match is None:
                out.append(line)
                i += 1
                continue
            body = [match.group("rest")]
            while j < len(lines) and lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) > item_indent:
                body.append(lines[j])
                j += 1
            for name in (n.strip() for n in match.group("names").split(",")):
                out.append(" " * item_indent + name + body[0])
                out.extend(body[1:])
            i = j
    return "\n".join(out)


_EXAMPLE_HEADING = re.compile(r"^(?P<indent>[ \t]*)Example:\s*$", re.MULTILINE)
# The first line of a Returns or Yields section, which the docstrings write as prose about the one value.
_RETURNS_FIRST_LINE = re.compile(r"^([ \t]*(?:Returns|Yields):[ \t]*\n(?:[ \t]*\n)*[ \t]+)(?=\S)", re.MULTILINE)


def rewrite(obj: griffe.Object | griffe.Alias, text: str) -> str:
    """``text`` (a docstring of ``obj``) with its Sphinx roles and math directives as Markdown."""
    text = _shared_params(text)
    # Napoleon's "Example:" is Griffe's "Examples:" (its >>> lines become code); otherwise an admonition.
    text = _EXAMPLE_HEADING.sub(lambda m: f"{m.group('indent')}Examples:", text)
    # Griffe reads "Returns:" text before a first colon as a type; a leading colon says "no type here" (the
    # type comes from the signature), so "A VQResult (a, b):" and "{'n': ...}" stay prose.
    text = _RETURNS_FIRST_LINE.sub(lambda m: m.group(1) + ": ", text)
    text = _math_directives(text)
    text = _MATH_ROLE.sub(lambda m: f"${m.group(1).strip()}$", text)
    return _XREF_ROLE.sub(lambda m: _xref(obj, m), text)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of a loaded package once, after all its modules (and aliases) exist.

    It also marks ``from m import x as x`` (the house's explicit re-export, PEP 484's convention) as public, so
    that a package page documents every name its ``__init__`` re-exports and nothing it merely imports, and
    keeps dataclasses' ``__post_init__`` off the pages.
    """

    def on_alias_instance(self, *, node: ast.AST | griffe.ObjectNode, alias: griffe.Alias, **kwargs: object) -> None:
        if isinstance(node, ast.ImportFrom) and any(n.asname == n.name == alias.name for n in node.names):
            alias.public = True

    def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj, obj.docstring.value)
            if obj.is_class:  # a dataclass's own validation is not something a user calls
                obj.members.pop("__post_init__", None)
            stack.extend(member for member in obj.members.values() if not member.is_alias)
