r"""A small decoder-only transformer for CLRS-Text, many models at once (private; needs torch).

Every parameter has a leading *model* dimension :math:`M`; the :math:`M`
models are trained together as one batched model (as in
the max-retrieval experiment). For :math:`S` seeds the run holds
:math:`M = 2S` models: model :math:`s` is seed :math:`s` trained with plain
softmax attention, model :math:`S + s` the same seed (same initial weights,
same training batches) trained with the adaptive temperature in every head.
The third variant of the paper's ablation, the adaptive temperature at
inference only, is model :math:`s` evaluated with the adaptive attention.

Architecture, for one model (width :math:`d`, :math:`h` heads, pre-norm):

.. math::

    x^{(0)}_t &= E[\text{token}_t], \\
    x' &= x + W_O\,\mathrm{Attn}_\sigma\bigl(\mathrm{RoPE}(W_Q\,\mathrm{LN}(x)),
          \mathrm{RoPE}(W_K\,\mathrm{LN}(x)), W_V\,\mathrm{LN}(x)\bigr), \\
    x'' &= x' + W_2\,\mathrm{GELU}(W_1\,\mathrm{LN}(x')),

repeated per layer, then :math:`\mathrm{LN}` and a linear read-out to the
vocabulary. :math:`\mathrm{Attn}_\sigma` is causal attention computed by
:func:`softmaxtheory.accelerated.torch.adaptive_attention` with the schedule
:math:`\sigma` of the model: :class:`~softmaxtheory.spec.Constant` ``(1)``
(plain softmax) or :class:`~softmaxtheory.spec.PaperPolynomial` (one
:math:`\beta` per query row and head, gradient through :math:`\beta`, as in
the paper's listing). Rotary position embeddings (RoPE, as in Gemma) keep the
model free of a learned table of absolute positions, so it can read sequences
longer than those it was trained on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from .._seeds import LossWindow, SeedLinear, make_generator

__all__ = [
    "VOCAB",
    "ClrsTextModel",
    "Evaluation",
    "TrainLog",
    "clip_per_model",
    "decode",
    "encode",
    "encode_batch",
    "evaluate",
    "train",
]

#: The character vocabulary (index 0 is padding): every character CLRS-Text
#: writes for these algorithms. One character, one token: numbers span several
#: tokens, as they do for Gemma's tokenizer (one token per digit).
VOCAB: tuple[str, ...] = ("<pad>", *"\n (),-.0123456789:[]_|abcdefghijklmnopqrstuvwxyzA")
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Token ids of `text` (one per character).

    Raises
    ------
    ValueError
        For a character outside :data:`VOCAB`.
    """
    try:
        return [_INDEX[c] for c in text]
    except KeyError as exc:
        bad = exc.args[0]
        raise ValueError(f"text holds a character outside the vocabulary: {bad!r}") from None


def decode(ids: Sequence[int]) -> str:
    """The text of token ids (padding dropped)."""
    return "".join(VOCAB[i] for i in ids if i != 0)


def encode_batch(
    pairs: Sequence[tuple[str, str]], device: Any = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs, next-token targets and the answer mask of (question, answer) pairs.

    Returns
    -------
    inputs : torch.Tensor, shape (B, L), int64
        ``question + answer`` without its last token.
    targets : torch.Tensor, shape (B, L), int64
        The next token at every position.
    answer : torch.Tensor, shape (B, L), bool
        ``True`` where the target is a token of the answer (the loss and the
        accuracy are measured there only).
    """
    seqs = [(encode(q), encode(a)) for q, a in pairs]
    length = max(len(q) + len(a) for q, a in seqs) - 1
    inputs = torch.zeros(len(seqs), length, dtype=torch.int64)
    targets = torch.zeros(len(seqs), length, dtype=torch.int64)
    answer = torch.zeros(len(seqs), length, dtype=torch.bool)
    for b, (q, a) in enumerate(seqs):
        full = torch.tensor(q + a, dtype=torch.int64)
        n = full.numel() - 1
        inputs[b, :n] = full[:-1]
        targets[b, :n] = full[1:]
        answer[b, len(q) - 1 : n] = True
    return inputs.to(device), targets.to(device), answer.to(device)


class _SeedLayerNorm(nn.Module):
    """``M`` independent layer norms over the last axis."""

    def __init__(self, models: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(models, 1, width))
        self.bias = nn.Parameter(torch.zeros(models, 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape
        y = F.layer_norm(x, x.shape[-1:])
        y = y.reshape(lead[0], -1, lead[-1]) * self.weight + self.bias
        return y.reshape(lead)


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on the last axis of ``(..., L, D)`` (D even)."""
    length, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * freq
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, schedule: Any) -> torch.Tensor:
    """Causal attention of one group of models with `schedule` (the library's kernel).

    Parameters
    ----------
    q, k, v : torch.Tensor, shape (..., H, L, D)
    schedule : softmaxtheory.spec.Schedule
        ``Constant(1)``: plain softmax; ``PaperPolynomial()``: adaptive.
    """
    from softmaxtheory.accelerated.torch import adaptive_attention

    return adaptive_attention(q, k, v, is_causal=True, schedule=schedule)


class ClrsTextModel(nn.Module):
    r"""Decoder-only transformers, ``len(seeds) * copies`` of them batched.

    Parameters
    ----------
    seeds : sequence of int
        Seed numbers; model ``c * len(seeds) + i`` is copy ``c`` of seed
        ``seeds[i]``, initialised from the ``"init"`` stream of that seed
        (every copy of a seed starts from the same weights).
    copies : int, default 2
        Models per seed (plain and adaptive).
    width, layers, heads : int
        Width :math:`d`, number of layers, heads per layer (``width % heads == 0``,
        even head dimension).
    """

    def __init__(
        self,
        seeds: Sequence[int],
        *,
        copies: int = 2,
        width: int = 64,
        layers: int = 2,
        heads: int = 4,
    ) -> None:
        super().__init__()
        self.seeds = tuple(int(s) for s in seeds)
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        if width < 2 or heads < 1 or width % heads or (width // heads) % 2:
            raise ValueError(
                f"width must be a multiple of heads with an even head dimension, "
                f"got width={width}, heads={heads}"
            )
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.copies = copies
        self.width, self.layers, self.heads = width, layers, heads
        m = len(self.seeds) * copies
        vocab = len(VOCAB)
        self.embed = nn.Parameter(torch.empty(m, vocab, width))
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            block = nn.ModuleDict(
                {
                    "ln1": _SeedLayerNorm(m, width),
                    "qkv": SeedLinear(m, width, 3 * width),
                    "out": SeedLinear(m, width, width),
                    "ln2": _SeedLayerNorm(m, width),
                    "fc1": SeedLinear(m, width, 4 * width),
                    "fc2": SeedLinear(m, 4 * width, width),
                }
            )
            self.blocks.append(block)
        self.ln_f = _SeedLayerNorm(m, width)
        self.head = SeedLinear(m, width, vocab)
        s = len(self.seeds)
        for i, seed in enumerate(self.seeds):
            gen = make_generator(seed, "init")
            emb = torch.randn(vocab, width, generator=gen) * 0.02
            linears = [mod for mod in self.modules() if isinstance(mod, SeedLinear)]
            for mod in linears:
                mod.init_seed(i, gen)
            with torch.no_grad():
                for c in range(copies):
                    self.embed[c * s + i].copy_(emb)
                    for mod in linears if c else ():
                        mod.weight[c * s + i].copy_(mod.weight[i])
                        mod.bias[c * s + i].copy_(mod.bias[i])

    @property
    def num_models(self) -> int:
        """``M = len(seeds) * copies``."""
        return len(self.seeds) * self.copies

    def forward(
        self,
        tokens: torch.Tensor,
        schedules: Sequence[Any],
        *,
        capture: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Next-token logits ``(M, B, L, V)`` of token ids ``(M, B, L)``.

        Parameters
        ----------
        tokens : torch.Tensor, shape (M, B, L)
            Right-padded token ids, one batch per model.
        schedules : sequence of Schedule, length M
            The attention schedule of each model (runs of equal schedules go to
            one kernel call).
        capture : list, optional
            Receives ``(q, k, v)`` of every layer (shape ``(M, B, H, L, D)``,
            after RoPE) for tests.
        """
        m, b, length = tokens.shape
        if m != self.num_models or len(schedules) != m:
            raise ValueError(
                f"tokens and schedules must have {self.num_models} models, "
                f"got {m} and {len(schedules)}"
            )
        x = self.embed[torch.arange(m, device=tokens.device)[:, None, None], tokens]
        groups: list[tuple[int, int, Any]] = []
        for i, sched in enumerate(schedules):
            if groups and groups[-1][2] == sched:
                groups[-1] = (groups[-1][0], i + 1, sched)
            else:
                groups.append((i, i + 1, sched))
        h, dh = self.heads, self.width // self.heads
        for block in self.blocks:
            qkv = block["qkv"](block["ln1"](x)).view(m, b, length, 3, h, dh)
            q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # (M, B, H, L, D) each
            q, k = _rope(q), _rope(k)
            if capture is not None:
                capture.append((q.detach(), k.detach(), v.detach()))
            outs = [attention(q[lo:hi], k[lo:hi], v[lo:hi], sched) for lo, hi, sched in groups]
            att = torch.cat(outs, 0) if len(outs) > 1 else outs[0]
            att = att.permute(0, 1, 3, 2, 4).reshape(m, b, length, self.width)
            x = x + block["out"](att)
            x = x + block["fc2"](F.gelu(block["fc1"](block["ln2"](x))))
        return self.head(self.ln_f(x))


@dataclass
class TrainLog:
    """What :func:`train` did.

    Attributes
    ----------
    steps : int
        Optimiser steps taken (fewer than asked when the time budget ran out).
    seconds : float
        Wall time of training.
    tokens_per_step : float
        Mean answer-and-question tokens per model and step.
    final_loss : list of float
        Mean answer cross-entropy of each model over the last logging window.
    history : list of tuple
        ``(step, [loss per model])`` at each logging point.
    """

    steps: int = 0
    seconds: float = 0.0
    tokens_per_step: float = 0.0
    final_loss: list[float] = field(default_factory=list)
    history: list[tuple[int, list[float]]] = field(default_factory=list)


def _draw_batch(
    rngs: Sequence[np.random.Generator],
    algorithm: str,
    sizes: Sequence[int],
    batch: int,
) -> list[list[tuple[str, str]]]:
    """One batch of (question, answer) pairs of `algorithm` per seed, sizes uniform per example.

    One algorithm per step keeps the lengths within a batch alike (little padding).
    """
    from .data import sample

    out = []
    for rng in rngs:
        pairs = []
        for _ in range(batch):
            size = int(sizes[int(rng.integers(len(sizes)))])
            s = sample(algorithm, size, rng)
            pairs.append((s.question, s.answer))
        out.append(pairs)
    return out


def _stack_pairs(
    per_seed: Sequence[Sequence[tuple[str, str]]], copies: int, device: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode the batches of every seed to one padded ``(copies * S, B, L)`` batch."""
    flat = [p for pairs in per_seed for p in pairs]
    inputs, targets, answer = encode_batch(flat, device)
    s, b = len(per_seed), len(per_seed[0])
    shape = (s, b, inputs.shape[-1])
    inputs, targets, answer = (
        t.view(shape).repeat(copies, 1, 1) for t in (inputs, targets, answer)
    )
    return inputs, targets, answer


def clip_per_model(model: ClrsTextModel, max_norm: float) -> torch.Tensor:
    r"""Clip each model's gradient to norm `max_norm`, independently of the others.

    Every parameter has the model dimension first, so model :math:`m`'s
    gradient norm is :math:`\lVert g_m\rVert = (\sum_p \lVert g_{p,m}\rVert^2)^{1/2}`
    and its gradient is scaled by :math:`\min(1, \text{max\_norm}/\lVert g_m\rVert)`.
    (One joint clip over all parameters would couple the models.)

    Returns
    -------
    torch.Tensor, shape (M,)
        The norms before clipping.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    sq = torch.zeros(model.num_models, device=model.embed.device)
    for g in grads:
        sq = sq + g.detach().pow(2).flatten(1).sum(1)
    norms = sq.sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))
    return norms


def train(
    model: ClrsTextModel,
    schedules: Sequence[Any],
    steps: int,
    *,
    algorithms: Sequence[str],
    sizes: Sequence[int],
    batch: int = 16,
    lr: float = 2e-3,
    weight_decay: float = 0.01,
    warmup: int = 100,
    max_seconds: float | None = None,
    log_every: int = 50,
    on_step: Callable[[int, list[float] | None], None] | None = None,
) -> TrainLog:
    r"""Train every model with AdamW on its seed's stream of CLRS-Text examples.

    Every copy of a seed sees the same batches. Step :math:`t` trains on
    algorithm ``algorithms[t % len(algorithms)]`` (one algorithm per step, so
    that the examples of a batch have similar lengths), each example of a
    size drawn uniformly from `sizes`. The loss is
    :math:`\sum_m \mathrm{CE}_m`, each model's mean cross-entropy over the
    answer tokens of its batch (the question is the prompt), so each model's
    gradient is its own; it is clipped to norm 1 per model
    (:func:`clip_per_model`), and AdamW acts element by element, so each model
    follows the trajectory it would follow alone (up to the floating-point order
    of the batched products). The learning rate warms up linearly over `warmup`
    steps, then follows a cosine to a tenth of `lr`.

    Parameters
    ----------
    model : ClrsTextModel
        The models.
    schedules : sequence of Schedule
        The attention schedule of each model during training.
    steps : int
        Optimiser steps.
    algorithms, sizes : sequence
        Training algorithms and problem sizes (uniform per example).
    batch : int, default 16
        Examples per step and model.
    lr, weight_decay, warmup : AdamW settings and warm-up steps.
    max_seconds : float, optional
        Stop after this much wall time.
    log_every : int, default 50
        Steps between loss read-outs.
    on_step : callable, optional
        Called after every step with the step count and, at logging points,
        the per-model losses.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    from .data import make_rng

    device = model.embed.device
    rngs = [make_rng(seed, "train") for seed in model.seeds]
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "ln" not in n]
    other = [p for n, p in model.named_parameters() if not (n.endswith("weight") and "ln" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    log = TrainLog()
    m = model.num_models
    window = LossWindow(m, device)
    tokens = 0.0
    start = time.perf_counter()
    for step in range(steps):
        pairs = _draw_batch(rngs, algorithms[step % len(algorithms)], sizes, batch)
        inputs, targets, answer = _stack_pairs(pairs, model.copies, device)
        tokens += float(inputs.shape[1] * inputs.shape[2])
        logits = model(inputs, schedules)
        per = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
        per = per.view(answer.shape) * answer
        per_model = per.sum((1, 2)) / answer.sum((1, 2))
        loss = per_model.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_per_model(model, 1.0)
        opt.step()
        sched.step()
        window.add(per_model)
        log.steps = step + 1
        losses = None
        out_of_time = max_seconds is not None and time.perf_counter() - start > max_seconds
        if (step + 1) % log_every == 0 or step + 1 == steps or out_of_time:
            losses = window.flush(log, step + 1)
        if on_step is not None:
            on_step(step + 1, losses)
        if out_of_time:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    log.seconds = time.perf_counter() - start
    log.tokens_per_step = tokens / max(1, log.steps)
    model.eval()
    return log


@dataclass
class Evaluation:
    """Per-model scores on one algorithm and size (arrays of one entry per seed).

    Attributes
    ----------
    algorithm : str
    size : int
    examples : int
        Evaluation examples per seed.
    token_acc : dict of str to numpy.ndarray
        Per variant (``"softmax"``, ``"adaptive"``, ``"inference_only"``):
        fraction of answer tokens whose greedy prediction, given the true
        prefix, is right.
    exact : dict of str to numpy.ndarray
        Per variant: fraction of examples whose whole answer (trace and
        output) is predicted right, i.e. what greedy decoding would write.
    output_exact : dict of str to numpy.ndarray
        Per variant: fraction of examples whose final output (after the last
        ``" | "``) is predicted right, given the true trace.
    answer_tokens : float
        Mean answer length in tokens.
    """

    algorithm: str
    size: int
    examples: int
    token_acc: dict[str, np.ndarray]
    exact: dict[str, np.ndarray]
    output_exact: dict[str, np.ndarray]
    answer_tokens: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "algorithm": self.algorithm,
            "size": self.size,
            "examples": self.examples,
            "answer_tokens": self.answer_tokens,
            "token_acc": {k: v.tolist() for k, v in self.token_acc.items()},
            "exact": {k: v.tolist() for k, v in self.exact.items()},
            "output_exact": {k: v.tolist() for k, v in self.output_exact.items()},
        }


#: The three variants, in the order of tables and plots.
VARIANTS: tuple[str, ...] = ("softmax", "adaptive", "inference_only")


@torch.no_grad()
def evaluate(
    model: ClrsTextModel,
    algorithm: str,
    size: int,
    examples: int,
    *,
    chunk: int = 8,
) -> Evaluation:
    """Score the three variants on `examples` fresh examples per seed (teacher forcing).

    Seed ``s`` draws its examples from its own ``("eval", algorithm, size)``
    stream, so every variant of a seed sees the same examples. Needs a model
    with two copies per seed (copy 0 trained plain, copy 1 adaptive).
    """
    from softmaxtheory.spec import Constant, PaperPolynomial

    from .data import ALGORITHMS, make_rng, sample

    if model.copies != 2:
        raise ValueError(f"model must have 2 copies per seed, got {model.copies}")
    device = model.embed.device
    s = len(model.seeds)
    plain, adaptive = Constant(1.0), PaperPolynomial()
    algo_id = ALGORITHMS.index(algorithm)
    data = [
        [sample(algorithm, size, rng) for _ in range(examples)]
        for rng in (make_rng(seed, "eval", algo_id, size) for seed in model.seeds)
    ]
    stats = {
        v: {"tok": np.zeros(s), "n_tok": np.zeros(s), "exact": np.zeros(s), "out": np.zeros(s)}
        for v in VARIANTS
    }
    answer_tokens = 0.0
    for lo in range(0, examples, chunk):
        hi = min(examples, lo + chunk)
        per_seed = [[(x.question, x.answer) for x in d[lo:hi]] for d in data]
        inputs, targets, answer = _stack_pairs(per_seed, 2, device)
        # where the final output starts: after the last " | " of the answer; one mask per
        # seed, repeated for the two copies as the batch is (a mask of the batch's 2 S rows,
        # repeated, left the adaptive copies' rows empty: their output always "right")
        out_mask = torch.zeros_like(answer[:s])
        for i, pairs in enumerate(per_seed):
            for j, (q, a) in enumerate(pairs):
                start = len(q) + a.rfind(" | ") + 3 - 1 if " | " in a else len(q) - 1
                out_mask[i, j, start : len(q) + len(a) - 1] = True
        out_mask = out_mask.repeat(2, 1, 1)
        answer_tokens += float(answer[0].sum())
        runs = (
            ([plain] * s + [adaptive] * s, {"softmax": slice(0, s), "adaptive": slice(s, 2 * s)}),
            ([adaptive] * s + [adaptive] * s, {"inference_only": slice(0, s)}),
        )
        for schedules, picks in runs:
            pred = model(inputs, schedules).argmax(-1)
            right = pred == targets
            for variant, sl in picks.items():
                r, a, o = right[sl], answer[sl], out_mask[sl]
                st = stats[variant]
                st["tok"] += (r & a).sum((1, 2)).cpu().numpy()
                st["n_tok"] += a.sum((1, 2)).cpu().numpy()
                st["exact"] += ((r | ~a).all(-1)).sum(-1).cpu().numpy()
                st["out"] += ((r | ~o).all(-1)).sum(-1).cpu().numpy()
    return Evaluation(
        algorithm=algorithm,
        size=size,
        examples=examples,
        token_acc={v: stats[v]["tok"] / stats[v]["n_tok"] for v in VARIANTS},
        exact={v: stats[v]["exact"] / examples for v in VARIANTS},
        output_exact={v: stats[v]["out"] / examples for v in VARIANTS},
        answer_tokens=answer_tokens / examples,
    )
