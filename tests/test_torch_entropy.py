"""softmaxtheory.accelerated.torch.attention_entropy (pass 1 of adaptive attention) on CPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softmaxtheory import reference as R  # noqa: E402, N812
from softmaxtheory.accelerated.torch import attention_entropy  # noqa: E402
from softmaxtheory.testing import assert_entropy_close  # noqa: E402

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _qk(dtype, H=2, Hkv=2, L=5, S=7, D=4, seed=0, mag=2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, L, D, generator=g, dtype=torch.float64) * mag
    k = torch.randn(2, Hkv, S, D, generator=g, dtype=torch.float64) * mag
    return q.to(dtype), k.to(dtype)


def _mask(name, L=5, S=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(L, S, generator=g) > 0.4
    keep[2] = False  # a fully masked query
    keep[0, 0] = True
    if name == "bool":
        return keep
    if name == "bias":
        add = torch.randn(L, S, generator=g, dtype=torch.float64)
        return add.masked_fill(~keep, -math.inf)
    return None


def _logits(q, k, mask, causal, scale=None):
    """float64 logits as the torch path forms them: (scale * q) @ k^T, then the mask."""
    qd, kd = q.double(), k.double()
    if kd.shape[1] != qd.shape[1]:
        kd = kd.repeat_interleave(qd.shape[1] // kd.shape[1], dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    x = (qd * scale) @ kd.transpose(-1, -2)
    L, S = x.shape[-2:]
    if causal:
        x = x.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    elif mask is not None and mask.dtype == torch.bool:
        x = x.masked_fill(~mask, -math.inf)
    elif mask is not None:
        x = torch.where(mask == -math.inf, torch.full_like(x, -math.inf), x + mask.double())
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", ["none", "causal", "bool", "bias"])
def test_entropy_and_lse_match_reference(dtype, mask_name):
    """Entropy within the oracle's error model of the float64 logits; LSE within a few ulps."""
    q, k = _qk(dtype)
    causal = mask_name == "causal"
    mask = _mask(mask_name)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    h, lse = attention_entropy(q, k, mask, causal)
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    assert h.dtype == lse.dtype == sd and h.shape == lse.shape == (2, 2, 5)
    x = _logits(q, k, mask, causal)
    live = torch.isfinite(x).any(-1)
    assert_entropy_close(h[live], x[live], dtype="float64" if sd == torch.float64 else "float32")
    ref_lse = torch.logsumexp(x, -1)
    u = 2.0**-52 if sd == torch.float64 else 2.0**-23
    tol = 8 * u * (7 + x.abs().where(torch.isfinite(x), 0).amax(-1))
    assert torch.all((lse.double() - ref_lse)[live].abs() <= tol[live])
    assert torch.all(h[~live] == 0) and torch.all(lse[~live] == -math.inf)


def test_grouped_query_heads_read_shared_keys():
    """enable_gqa: query head h reads key head h // group, equal to repeating the keys."""
    q, k = _qk(torch.float64, H=6, Hkv=2)
    h, lse = attention_entropy(q, k, enable_gqa=True)
    h2, lse2 = attention_entropy(q, k.repeat_interleave(3, dim=1))
    torch.testing.assert_close(h, h2, rtol=0, atol=1e-15)
    torch.testing.assert_close(lse, lse2, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="enable_gqa"):
        attention_entropy(q[:, :5], k, enable_gqa=True)
    with pytest.raises(ValueError, match="broadcast"):
        attention_entropy(q, k)  # heads differ without enable_gqa


def test_causal_with_more_queries_than_keys():
    q, k = _qk(torch.float64, L=9, S=4)
    h, lse = attention_entropy(q, k, is_causal=True)
    x = _logits(q, k, None, True)
    np.testing.assert_allclose(h.numpy(), R.entropy(x.numpy()), rtol=0, atol=1e-14)
    torch.testing.assert_close(lse, torch.logsumexp(x, -1))


@pytest.mark.parametrize("mask_name", ["none", "causal", "bias"])
def test_gradcheck_float64(mask_name):
    """Gradients of entropy and LSE with respect to q and k (float64 gradcheck)."""
    q, k = _qk(torch.float64, L=3, S=4, D=3)
    mask = _mask(mask_name, L=3, S=4)
    if mask is not None:
        mask[2] = torch.tensor([0.5, -math.inf, 0.0, 1.0], dtype=torch.float64)  # no empty row
    causal = mask_name == "causal"

    def fn(a, b):
        h, lse = attention_entropy(a, b, mask, causal)
        return h, lse

    args = (q.requires_grad_(), k.requires_grad_())
    assert torch.autograd.gradcheck(fn, args)


def test_gradient_is_finite_on_fully_masked_rows():
    q, k = _qk(torch.float64)
    q.requires_grad_()
    h, lse = attention_entropy(q, k, _mask("bool"))
    (h.sum() + lse.where(torch.isfinite(lse), 0).sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[:, :, 2] == 0)


def test_special_values():
    q, k = _qk(torch.float64)
    q[0, 0, 1, 0] = math.nan
    k[0, 1, 3, 2] = math.inf
    h, lse = attention_entropy(q, k)
    assert torch.isnan(h[0, 0, 1]) and torch.isnan(lse[0, 0, 1])
    assert torch.isnan(h[0, 1]).all()
    assert torch.isfinite(h[1]).all() and torch.isfinite(h[0, 0, 0])


@pytest.mark.parametrize(
    ("qs", "ks"),
    [((0, 2, 3, 4), (0, 2, 5, 4)), ((2, 0, 3, 4), (2, 0, 5, 4)), ((2, 2, 0, 4), (2, 2, 5, 4)),
     ((2, 2, 3, 4), (2, 2, 0, 4)), ((2, 2, 3, 0), (2, 2, 5, 0))],
    ids=["B=0", "H=0", "L=0", "S=0", "D=0"],
)  # fmt: skip
def test_zero_size_dimensions(qs, ks):
    """Empty batches and sequences give empty results; no keys gives H = 0, LSE = -inf."""
    h, lse = attention_entropy(torch.ones(qs), torch.ones(ks))
    assert h.shape == lse.shape == qs[:-1]
    if qs[-1] == 0:  # zero features: every logit is 0, uniform over S keys
        torch.testing.assert_close(h, torch.full(qs[:-1], math.log(ks[-2])))
        torch.testing.assert_close(lse, h)
    elif ks[-2] == 0 and h.numel():
        assert torch.all(h == 0) and torch.all(lse == -math.inf)


def test_overflowing_logits_are_finite():
    """Finite logits whose spread overflows: the reference's numbers, not NaN."""
    q = torch.tensor([[1.0]], dtype=torch.float64)
    k = torch.tensor([[1e308], [-1e308], [1e308]], dtype=torch.float64)
    h, lse = attention_entropy(q, k, scale=1.0)
    torch.testing.assert_close(h, torch.tensor([math.log(2)], dtype=torch.float64))
    assert lse.item() == pytest.approx(1e308 + math.log(2), rel=1e-15)
    q32 = torch.tensor([[1.0]])
    h, lse = attention_entropy(q32, torch.tensor([[3e38], [-3e38]]), scale=1.0)
    assert h.item() == 0.0 and lse.item() == pytest.approx(3e38, rel=1e-7)
    # logits beyond float64 (q, k ~ 1e200): one key dominates
    k = torch.tensor([[1e200], [-1e200]], dtype=torch.float64)
    h, lse = attention_entropy(torch.tensor([[1e200]], dtype=torch.float64), k, scale=1.0)
    assert h.item() == 0.0 and lse.item() == math.inf


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"q": [1.0]}, TypeError, "q"),
        ({"k": torch.ones(3, 2).to_sparse()}, TypeError, "k must be a dense"),
        ({"attn_mask": torch.ones(2, 3, dtype=torch.bool).to_sparse()}, TypeError, "attn_mask"),
        ({"is_causal": 1}, TypeError, "is_causal"),
        ({"enable_gqa": "yes"}, TypeError, "enable_gqa"),
        ({"scale": math.inf}, ValueError, "scale"),
        ({"k": torch.ones(3, 5)}, ValueError, "feature size"),
    ],
)
def test_input_errors(kwargs, exc, word):
    args = {"q": torch.ones(2, 2), "k": torch.ones(3, 2), **kwargs}
    with pytest.raises(exc, match=word):
        attention_entropy(**args)


@pytest.mark.parametrize(
    ("mask_name", "H", "Hkv", "L", "S"),
    [("bool", 2, 2, 3, 5), ("causal", 4, 2, 7, 4), ("bias", 6, 3, 5, 3), ("none", 4, 1, 1, 6)],
    ids=["bool", "causal-gqa-L>S", "bias-gqa-L>S", "none-mqa-L=1"],
)
def test_gradcheck_float64_gqa_and_lengths(mask_name, H, Hkv, L, S):
    """The pass-1 backward (torch twin of the Triton kernel): float64 gradcheck with boolean
    masks, causal with L > S, grouped-query heads (dk summed over a group), odd lengths."""
    q, k = _qk(torch.float64, H=H, Hkv=Hkv, L=L, S=S, D=3, seed=4)
    mask = _mask(mask_name, L=L, S=S, seed=5) if mask_name != "none" else None
    if mask is not None:
        mask[:, 0] = True if mask.dtype == torch.bool else 0.25  # no fully masked query
    causal = mask_name == "causal"

    def fn(a, b):
        return attention_entropy(a, b, mask, causal, enable_gqa=True)

    assert torch.autograd.gradcheck(fn, (q.requires_grad_(), k.requires_grad_()))


def test_backward_recomputes_from_the_lse(monkeypatch):
    """With a gradient, pass 1 runs under no_grad and its own backward recomputes p from the
    stored log-sum-exp (no tile is kept): the backward function is called once."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    calls = []
    original = A.entropy_lse_backward

    def spy(*args):
        calls.append(args[0].q.shape)
        return original(*args)

    monkeypatch.setattr(A, "entropy_lse_backward", spy)
    q, k = _qk(torch.float64)
    q.requires_grad_()
    h, lse = attention_entropy(q, k)
    assert type(h.grad_fn).__name__ == "ViewBackward0"
    assert "_Pass1" in type(h.grad_fn.next_functions[0][0]).__name__
    (h.sum() + lse.sum()).backward()
    assert calls == [q.shape]


def test_nan_mask_entry_does_not_poison_other_gradients():
    """Regression: a NaN additive-mask entry makes its row NaN; a loss on the other rows gets
    finite gradients for every key (autograd through the tiles gave NaN for all of dk)."""
    q, k = _qk(torch.float64, L=4, S=5, D=3, seed=6)
    q.requires_grad_()
    k.requires_grad_()
    mask = torch.zeros(4, 5, dtype=torch.float64)
    mask[2, 1] = math.nan
    h, _ = attention_entropy(q, k, mask)
    assert torch.isnan(h[:, :, 2]).all() and torch.isfinite(h[:, :, [0, 1, 3]]).all()
    h.where(torch.isfinite(h), 0).sum().backward()
    assert torch.isfinite(k.grad).all() and torch.all(q.grad[:, :, 2] == 0)


@pytest.mark.parametrize(
    ("kind", "tiles"), [("bool", 2.5), ("bias", 2.5), ("none", 2.25), ("causal", 2.25)]
)
def test_pass_one_tiles_are_written_over_without_a_graph(kind, tiles):
    """Without a graph, the torch pass 1 writes every block's logits, shifted logits and
    weights over two scratch tensors of a tile's size: beside the inputs its peak is those
    two and, with a mask, the mask of the tile's masked entries (2.35 tiles in float32;
    3.25 when each block formed its own tiles and the masks formed new logits, 4.3 when each
    operation formed its own result), and the entropies and log-sum-exps are those of the
    recorded path, bit for bit."""
    from tests.support.live_bytes import OpLedger

    q, k = _qk(torch.float32, L=64, S=256, D=16, seed=4)
    keep = torch.rand(64, 256, generator=torch.Generator().manual_seed(5)) > 0.3
    bias = torch.randn(64, 256, generator=torch.Generator().manual_seed(6)).masked_fill(
        ~keep, -math.inf
    )
    mask = {"bool": keep, "bias": bias}.get(kind)
    causal = kind == "causal"
    with torch.no_grad(), OpLedger() as ledger:
        h, lse = attention_entropy(q, k, attn_mask=mask, is_causal=causal)
    tile = 4 * math.prod(q.shape[:-1]) * k.shape[-2]  # float32 logits of every query (one tile)
    assert ledger.peak <= tiles * tile, ledger.peak / tile
    h_rec, lse_rec = attention_entropy(
        q.clone().requires_grad_(), k, attn_mask=mask, is_causal=causal
    )
    assert torch.equal(h, h_rec.detach()) and torch.equal(lse, lse_rec.detach())


@pytest.mark.parametrize("group", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize(("L", "S"), [(23, 23), (23, 11), (11, 23)])
def test_causal_blocks_form_only_the_keys_they_see(monkeypatch, L, S, group):
    """Under ``is_causal`` a block of queries forms its logits against the keys up to its last
    query only (the later ones are masked for each of its rows): in blocks of 3 queries, the
    entropies, the log-sum-exps and their gradients are those of the float64 logits."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812

    q, k = _qk(torch.float64, H=2, Hkv=2 // group, L=L, S=S, D=4, seed=7)
    monkeypatch.setattr(A, "CHUNK_ELEMENTS", 2 * 2 * S * 3)  # B * H * S per query: 3 a block
    widths = []
    tile_logits = A._tile_logits

    def spy(p, i0, i1, *args):
        x = tile_logits(p, i0, i1, *args)
        widths.append((i0, i1, x.shape[-1]))
        return x

    monkeypatch.setattr(A, "_tile_logits", spy)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    h, lse = attention_entropy(qg, kg, is_causal=True, enable_gqa=group > 1)
    w_h, w_lse = torch.randn(2, 2, 2, L, generator=torch.Generator().manual_seed(8), dtype=q.dtype)
    dq, dk = torch.autograd.grad((h * w_h + lse * w_lse).sum(), (qg, kg))  # pass 1's backward
    forward, backward = widths[: len(widths) // 2], widths[len(widths) // 2 :]
    assert [i0 for i0, _, _ in forward] == list(range(0, L, 3)) and backward == forward
    assert all(n == min(S, i1) for _, i1, n in widths), widths

    qr, kr = q.clone().requires_grad_(), k.clone().requires_grad_()
    x = _logits(qr, kr, None, True)
    lse_r = torch.logsumexp(x, -1)
    p = torch.exp(x - lse_r.unsqueeze(-1))
    h_r = lse_r - (p * torch.where(torch.isfinite(x), x, 0.0)).sum(-1)  # H = LSE - sum p x
    torch.testing.assert_close(h, h_r, rtol=0, atol=1e-13)
    torch.testing.assert_close(lse, lse_r, rtol=0, atol=1e-13)
    dq_r, dk_r = torch.autograd.grad((h_r * w_h + lse_r * w_lse).sum(), (qr, kr))
    torch.testing.assert_close(dq, dq_r, rtol=0, atol=1e-12)
    torch.testing.assert_close(dk, dk_r, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_tiles_whose_masks_are_known_give_the_general_paths_bits(monkeypatch, dtype, causal):
    """Over finite operands a tile's ``-inf`` entries are known (none, or the causal mask's):
    pass 1 and its backward then skip the comparison with ``-inf`` and fill only the causal
    mask's columns, and give the bits of the general path (which reads them from the tile),
    with and without a graph, in blocks of 5 queries."""
    from softmaxtheory.accelerated import _torch_attention as A  # noqa: N812
    from tests.support.spies import record_results

    q, k = _qk(dtype, L=29, S=31, D=8, seed=9)
    monkeypatch.setattr(A, "CHUNK_ELEMENTS", 2 * 2 * 31 * 5)
    w = torch.randn(2, 2, 2, 29, generator=torch.Generator().manual_seed(10), dtype=dtype)

    verdicts = record_results(monkeypatch, A, "_masks_known")

    def run():
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        with torch.no_grad():
            h0, lse0 = attention_entropy(q, k, is_causal=causal)  # (tiles written over)
        h, lse = attention_entropy(qg, kg, is_causal=causal)
        grads = torch.autograd.grad((h * w[0] + lse * w[1]).sum(), (qg, kg))
        return h0, lse0, h.detach(), lse.detach(), *grads

    known = run()
    assert verdicts == [True] * 3  # (the forward without and with a graph, the backward)
    monkeypatch.setattr(A, "_masks_known", lambda p, t: False)
    general = run()
    for a, b in zip(known, general, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(known[0], known[2])
