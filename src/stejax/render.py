"""Plain-text and Markdown renderings of the estimator catalog.

One place for how an estimator's math and facts read outside Python: ``stejax
list`` and ``stejax show`` print :func:`plain_math` (a Unicode reading of the
catalog's LaTeX), and ``docs/generate.py`` writes the catalog page with
:func:`render_page`. Both read only the catalog entries, so the terminal and the
documentation cannot disagree.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import Any

from stejax.estimators._entry import Entry, ParamSpec
from stejax.estimators.catalog import FAMILIES

__all__ = [
    "FAMILY_EXAMPLES",
    "IMAGES",
    "catalog_markdown",
    "default_text",
    "derivative_math",
    "first_paragraph",
    "input_text",
    "markdown_roles",
    "plain_math",
    "plain_roles",
    "render_entry",
    "render_page",
    "table_math",
    "table_roles",
]

# The folder of the pictures, relative to the catalog page.
IMAGES = "img"

# One runnable example per family, shown under the family's heading on the catalog page (each runs in
# tests/test_docs.py, in order, in one namespace).
FAMILY_EXAMPLES: dict[str, tuple[str, str]] = {
    "rounding": (
        "The value is the rounding's; the gradient is the identity's. `stochastic_round` takes an explicit key.",
        """
import jax
import jax.numpy as jnp

import stejax

x = jnp.array([0.4, 1.5, 2.5, -0.6])
print(stejax.round_ste(x))  # [ 0.  2.  2. -1.]: ties to even, as jnp.round
print(jax.grad(lambda x: stejax.round_ste(x).sum())(x))  # [1. 1. 1. 1.]
print(stejax.stochastic_round(x, key=jax.random.key(0)))  # up or down, with E[y] = x
""",
    ),
    "binary": (
        "Binary and ternary weights: the forward is exactly ±1 (or 0, ±1); the derivative is clipped.",
        """
w = jnp.array([-1.7, -0.2, 0.0, 0.3, 2.0])
print(stejax.sign_ste(w))  # [-1. -1.  1.  1.  1.]: sign(0) = +1
print(jax.grad(lambda w: stejax.sign_ste(w).sum())(w))  # [0. 1. 1. 1. 0.]: zero outside |w| <= 1
print(stejax.absmean_ternary(w))  # BitNet b1.58: codes in {-1, 0, 1} times the mean |w|
""",
    ),
    "uniform": (
        "Uniform quantisers. `fake_quant` takes a scale (from a calibration such as `absmax_scale`); `lsq` "
        "learns its step. Initialise the step as the LSQ paper does, 2·mean|w|/√Q_P, and train it with the "
        "weights: it is one more leaf of the parameters.",
        """
import optax

scale = stejax.absmax_scale(w, bits=8)
print(stejax.fake_quant(w, scale, bits=8))  # int8 codes times the scale

bits = 4
q_p = 2 ** (bits - 1) - 1  # the largest signed code: 7
w = jax.random.normal(jax.random.key(0), (256,))
params = {"w": w, "step": 2 * jnp.abs(w).mean() / jnp.sqrt(q_p)}
target = jnp.round(w * 3) / 3  # something to fit


def loss(p):
    return jnp.mean((stejax.lsq(p["w"], p["step"], bits=bits) - target) ** 2)


optimizer = optax.adam(1e-2)
state = optimizer.init(params)
for _ in range(20):
    grads = jax.grad(loss)(params)
    updates, state = optimizer.update(grads, state)
    params = optax.apply_updates(params, updates)
print(float(params["step"]))  # the step moved with the weights
""",
    ),
    "latent": (
        "Latent quantisers for autoencoders: a codebook's nearest code (`vq_quantize`, `rotation_trick`) or "
        "finite scalar quantisation (`fsq`), with the encoder's gradient passed through.",
        """
z = jax.random.normal(jax.random.key(1), (4, 3))
codebook = jax.random.normal(jax.random.key(2), (16, 3))
q = stejax.vq_quantize(z, codebook)  # each row replaced by its nearest code
print(jnp.isin(q, codebook).all(), jax.grad(lambda z: stejax.vq_quantize(z, codebook).sum())(z).shape)
print(stejax.fsq(jnp.tanh(z), levels=(8, 5, 5)))  # each channel on its own grid of levels
""",
    ),
    "spiking": (
        "Spikes: the forward is the step function; each surrogate is a different derivative around the threshold.",
        """
v = jnp.array([-1.0, -0.05, 0.0, 0.05, 1.0])  # membrane potential minus threshold
print(stejax.heaviside_fast_sigmoid(v))  # [0. 0. 0. 1. 1.]: a spike where v > 0
print(jax.grad(lambda v: stejax.heaviside_fast_sigmoid(v, slope=25.0).sum())(v))
print(jax.grad(lambda v: stejax.heaviside(v, "triangular").sum())(v))
""",
    ),
}

# fmt: off
_SYMBOLS = {
    "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "partial": "∂", "sim": "~",
    "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈",
    "cdot": "·", "times": "×", "in": "∈", "infty": "∞", "pm": "±", "mp": "∓", "to": "→",
    "mapsto": "↦", "sum": "Σ", "prod": "Π", "lVert": "‖", "rVert": "‖", "Vert": "‖", "|": "‖",
    "vert": "|", "lvert": "|", "rvert": "|", "langle": "⟨", "rangle": "⟩", "odot": "⊙",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε",
    "varepsilon": "ε", "eta": "η", "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π",
    "sigma": "σ", "tau": "τ", "phi": "φ", "omega": "ω", "Theta": "Θ",
    "operatorname": "", "mathrm": "", "text": "", "mathbf": "", "mathit": "", "left": "", "right": "",
    "quad": "  ", "qquad": "   ", ",": " ", ";": " ", " ": " ", "!": "", "_": "_",
    "ell": "ℓ", "neg": "¬", "top": "ᵀ", "big": "", "Big": "", "bigg": "", "Bigg": "",
    **{f: f for f in ("tanh", "cosh", "sinh", "exp", "log", "ln", "sin", "cos", "max", "min", "sgn", "arg")},
}
# fmt: on
# Commands after which LaTeX's separating space is dropped: "\partial y" reads "∂y", "\alpha x" "αx".
_JOINED = {"partial", "operatorname", "mathrm", "text", "mathbf", "mathit", "left", "right"} | {
    name for name, char in _SYMBOLS.items() if len(char) == 1 and char.isalpha()
}


def plain_math(latex: str) -> str:
    """A readable plain-text form of ``latex`` for the terminal; unknown commands stay as written."""
    text = latex.replace(r"\mathbb{1}", "𝟙")
    # Accents and groupings that read as words: \overline{|x|} is a mean, \widehat{v} a unit vector.
    text = re.sub(r"\\overline\{([^{}]*)\}", r"mean(\1)", text)
    text = re.sub(r"\\widehat\{([^{}]*)\}", r"unit(\1)", text)
    text = re.sub(r"\\tfrac(\d)(\d)", r"\1/\2", text)

    def symbol(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in _SYMBOLS:
            return match.group(0)
        space = "" if name in _JOINED else match.group(0)[len(name) + 1 :]
        return _SYMBOLS[name] + space

    # A command name ends at its first non-letter and may eat one space, as in LaTeX.
    text = re.sub(r"\\([A-Za-z]+) ?|\\([|,;! _])", symbol, text)
    # A dot (the tangent) or a hat over one symbol: the combining accent after it.
    text = re.sub(r"\\dot ?(\w)", "\\1\u0307", text)
    text = re.sub(r"\\hat ?(\w)", "\\1\u0302", text)
    # \frac{a}{b} -> a/b, parenthesised unless single tokens; nested fractions stay LaTeX.
    group = r"\{((?:[^{}]|\{[^{}]*\})*)\}"  # braces holding at most one level of braces
    text = re.sub(r"\\[dt]?frac" + group + group, lambda m: f"{_atom(m[1])}/{_atom(m[2])}", text)
    if re.search(r"\\[A-Za-z]", text):
        # A command this reader does not know: the LaTeX as written is clearer than half a translation.
        return " ".join(latex.split())
    # Braces that only grouped (after \text, \operatorname, ...) go.
    text = re.sub(r"(?<!\\)[{}]", "", text)
    # Escaped braces are set braces: \{-1, 0, +1\} reads {-1, 0, +1}.
    text = text.replace("\\{", "{").replace("\\}", "}")
    text = " ".join(text.split())
    return re.sub(r" ([⌋⌉⟩])", r"\1", re.sub(r"([⌊⌈⟨]) ", r"\1", text))


def _atom(text: str) -> str:
    return text if re.fullmatch(r"\w+", text) else f"({text})"


def default_text(entry: Entry, spec: ParamSpec) -> str | None:
    """The default's repr as the signature has it, or None when the parameter is required.

    A ParamSpec default of None may mean "required" or "defaults to None"; the
    estimator's signature decides.
    """
    if spec.default is not None:
        return repr(spec.default)
    try:
        param = inspect.signature(entry.fn).parameters.get(spec.name)
    except (TypeError, ValueError):
        param = None
    if param is not None and param.default is not inspect.Parameter.empty:
        return repr(param.default)
    return None


def derivative_math(entry: Entry) -> str:
    if entry.derivative_math:
        return entry.derivative_math
    return "a tangent map (non-diagonal Jacobian)" if entry.tangent is not None else ""


def input_text(entry: Entry) -> str:
    if entry.input_rank == 0:
        return ""
    return f"rank >= {entry.input_rank}; the last axis is the code (channel) dimension"


def first_paragraph(fn: Any) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


_ROLE = re.compile(r":(math|func|class|meth|attr|data|mod|exc|obj):`([^`]+)`")


def markdown_roles(text: str) -> str:
    r"""The docstrings' Sphinx roles as Markdown: ``:math:`x``` as ``$x$``, ``:func:`f``` as code.

    >>> markdown_roles(r"Binarise to :math:`\pm 1` like :func:`sign_ste`.")
    'Binarise to $\\pm 1$ like `sign_ste`.'
    """
    return _ROLE.sub(lambda m: f"${m.group(2)}$" if m.group(1) == "math" else f"`{m.group(2)}`", text)


def plain_roles(text: str) -> str:
    r"""The docstrings' Sphinx roles and literals as plain text for the terminal.

    ``:math:`x``` becomes :func:`plain_math` of ``x``, ``:func:`f``` (and the other
    roles) the bare name ``f``, and a ``literal`` its content.

    >>> plain_roles(r"To :math:`\{-1, 0, +1\}` or :math:`\pm 1` like :func:`sign_ste`, at ``bits`` bits.")
    'To {-1, 0, +1} or ± 1 like sign_ste, at bits bits.'
    """
    text = _ROLE.sub(lambda m: plain_math(m.group(2)) if m.group(1) == "math" else m.group(2).lstrip("~."), text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def table_roles(text: str) -> str:
    r"""Sphinx roles as Markdown for a table cell: :func:`markdown_roles` with each formula's bars as ``\vert``.

    >>> table_roles(r"Scale by :math:`|x|` like :func:`sign_ste`.")
    'Scale by $\\vert x\\vert $ like `sign_ste`.'
    """
    return _ROLE.sub(lambda m: table_math(m.group(2)) if m.group(1) == "math" else f"`{m.group(2)}`", text)


def catalog_markdown(entries: Iterable[Entry], *, image_dir: str) -> str:
    """A Markdown summary table of ``entries``, each row linking to its plot in ``image_dir``."""
    lines = [
        "# stejax estimators",
        "",
        "| name | family | forward | surrogate derivative | reference | plot |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        cells = [
            f"`{e.name}`",
            e.family,
            table_math(e.forward_math),
            table_math(e.derivative_math) or derivative_math(e),
            e.reference.replace("|", "/"),
            f"[png]({image_dir}/{e.name}.png)",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_math(latex: str) -> str:
    # A bare | ends a Markdown table cell; \vert and \Vert typeset the same bars.
    if not latex:
        return ""
    return "$" + latex.replace("\\|", "\\Vert ").replace("|", "\\vert ") + "$"


def render_page(entries: Iterable[Entry]) -> str:
    """The catalog page (``docs/estimators.md``): a summary table, then one section per estimator by family."""
    entries = list(entries)
    lines = [
        "# Estimators",
        "",
        "<!-- Generated by docs/generate.py from stejax's catalog; do not edit by hand. -->",
        "",
        f"{len(entries)} estimators. Each section gives the exact forward function, the declared "
        "surrogate derivative, the behaviour at kinks and ties, the static parameters, and the paper. "
        "The left panel of each picture is the forward function and the right panel the surrogate "
        "derivative, with kinks and ties as dotted lines; its caption says how inputs of rank 1, "
        "extra arrays and random draws were handled.",
        "",
        "| name | family | what it does |",
        "|---|---|---|",
    ]
    # The summary is words (which wrap); each formula is in the estimator's section, where it has the
    # page's width: a table of formulas, which do not wrap, overflowed a 1280 px screen.
    for e in entries:
        link = f"[`{e.name}`](#{_anchor(e.name)})"
        lines.append(f"| {link} | {e.family} | {_cell(table_roles(first_paragraph(e.fn)))} |")
    for family in FAMILIES:
        members = [e for e in entries if e.family == family]
        if not members:
            continue
        lines += ["", f"## {family.capitalize()}"]
        if family in FAMILY_EXAMPLES:
            intro, code = FAMILY_EXAMPLES[family]
            lines += ["", intro, "", "```python", code.strip("\n"), "```"]
        for e in members:
            lines += ["", *render_entry(e)]
    return "\n".join(lines) + "\n"


def render_entry(e: Entry) -> list[str]:
    """One estimator's section of the catalog page, as Markdown lines."""
    lines = [f"### `{e.name}`", ""]
    summary = markdown_roles(first_paragraph(e.fn))
    if summary:
        lines += [summary, ""]
    call = ", ".join(["x", *(a.name for a in e.args), *(f"{p.name}=..." for p in e.params)])
    if e.random:
        call += ", key=key"
    lines += [f"`stejax.{e.name}({call})`", ""]
    lines += ["**Forward**", "", f"$$ {e.forward_math} $$", ""]
    lines += ["**Surrogate derivative**", ""]
    if e.derivative_math:
        lines += [f"$$ {e.derivative_math} $$", ""]
    if e.derivative is None:
        lines += [_tangent_note(e) + ".", ""]
    if e.kinks:
        lines += [f"**Kinks and ties.** {e.kinks}", ""]
    if e.integral:
        lines += [f"**Integral of the surrogate.** {e.integral}", ""]
    if e.input_rank:
        lines += [
            f"**Input.** Rank at least {e.input_rank}; the last axis is the code (channel) dimension.",
            "",
        ]
    if e.random:
        lines += ["**Random.** Takes a PRNG key as the required keyword argument `key`.", ""]
    if e.params:
        lines += ["**Parameters**", "", "| name | default | values tried | meaning |", "|---|---|---|---|"]
        for p in e.params:
            default = f"`{text}`" if (text := default_text(e, p)) is not None else "required"
            values = ", ".join(f"`{v!r}`" for v in p.values)
            lines.append(f"| `{p.name}` | {default} | {values} | {_cell(p.doc)} |")
        lines.append("")
    if e.args:
        lines += ["**Extra arrays**", "", "| name | differentiable | meaning |", "|---|---|---|"]
        for a in e.args:
            lines.append(f"| `{a.name}` | {'yes' if a.differentiable else 'no'} | {_cell(a.doc)} |")
        lines.append("")
    if e.reference:
        lines += [f"**Reference.** {e.reference}", ""]
    lines.append(f"![{e.name}: forward and surrogate derivative]({IMAGES}/{e.name}.png)")
    return lines


def _tangent_note(e: Entry) -> str:
    if e.tangent is None:
        return ""
    return "a linear tangent map (the surrogate Jacobian is not diagonal); the picture shows its diagonal"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _anchor(name: str) -> str:
    # GitHub's heading anchors: lower case, punctuation other than - and _ dropped.
    return "".join(c for c in name.lower() if c.isalnum() or c in "-_")
