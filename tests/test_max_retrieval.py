"""The max-retrieval experiment: data, batched model, statistics, bounds and the CLI."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

from softmaxtheory import bounds, cli  # noqa: E402
from softmaxtheory.experiments import max_retrieval as mr  # noqa: E402
from softmaxtheory.experiments.max_retrieval import data  # noqa: E402
from softmaxtheory.experiments.max_retrieval import model as mdl  # noqa: E402
from softmaxtheory.experiments.max_retrieval import report as rep  # noqa: E402
from softmaxtheory.spec import Constant, PaperPolynomial  # noqa: E402

WIDTH = 16  # tiny models: the tests check the plumbing, not the learning


# --------------------------------------------------------------------------- data


def test_eval_sets_shapes_ranges_and_targets():
    sets = data.sample_eval_sets(37, 50, data.make_generator(3, "eval", 37))
    assert sets.priority.shape == (50, 37) and sets.priority.dtype == torch.float32
    assert sets.classes.shape == (50, 37) and sets.classes.dtype == torch.int64
    assert sets.query.shape == (50,) and sets.target.shape == (50,)
    assert sets.mask is None and sets.num_items == 37
    assert float(sets.priority.min()) >= 0.0 and float(sets.priority.max()) < 1.0
    assert float(sets.query.min()) >= 0.0 and float(sets.query.max()) < 1.0
    assert set(sets.classes.unique().tolist()) <= set(range(data.NUM_CLASSES))
    for b in range(50):
        j = int(np.argmax(sets.priority[b].numpy()))
        assert int(sets.target[b]) == int(sets.classes[b, j])


def test_train_sets_sizes_mask_and_targets():
    sets = data.sample_train_sets(200, data.make_generator(0, "train"), steps=3)
    assert sets.priority.shape == (3, 200, data.TRAIN_MAX_ITEMS)
    assert sets.mask is not None and sets.mask.dtype == torch.bool
    sizes = sets.mask.sum(-1)
    assert int(sizes.min()) == data.TRAIN_MIN_ITEMS and int(sizes.max()) == data.TRAIN_MAX_ITEMS
    # the mask is a prefix; padded items never win and hold class 0
    assert torch.equal(sets.mask, torch.arange(16) < sizes.unsqueeze(-1))
    assert torch.all(sets.priority[~sets.mask] == -1.0)
    assert torch.all(sets.classes[~sets.mask] == 0)
    real = sets.priority[sets.mask]
    assert float(real.min()) >= 0.0 and float(real.max()) < 1.0
    p = sets.priority.numpy()
    c = sets.classes.numpy()
    expect = np.take_along_axis(c, p.argmax(-1)[..., None], -1)[..., 0]
    assert np.array_equal(sets.target.numpy(), expect)


def test_seeding_is_reproducible_and_streams_differ():
    a = data.sample_eval_sets(16, 8, data.make_generator(5, "eval", 16))
    b = data.sample_eval_sets(16, 8, data.make_generator(5, "eval", 16))
    c = data.sample_eval_sets(16, 8, data.make_generator(6, "eval", 16))
    d = data.sample_eval_sets(16, 8, data.make_generator(5, "eval", 32))
    assert torch.equal(a.priority, b.priority) and torch.equal(a.classes, b.classes)
    assert not torch.equal(a.priority, c.priority)
    assert not torch.equal(a.priority, d.priority)
    seeds = {data.derive_seed(s, p) for s in range(4) for p in ("init", "train", "eval")}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize(
    ("args", "match"),
    [((-1, "init"), "seed"), ((0, "bogus"), "purpose"), ((0, "eval", -3), "extra")],
)
def test_derive_seed_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        data.derive_seed(*args)


def test_samplers_reject_bad_sizes():
    gen = data.make_generator(0, "eval")
    with pytest.raises(ValueError, match="n must be"):
        data.sample_eval_sets(0, 4, gen)
    with pytest.raises(ValueError, match="min_items"):
        data.sample_train_sets(4, gen, min_items=9, max_items=8)


# --------------------------------------------------------------------------- model


def _sets(seeds, n, batch):
    return data.stack_sets(
        [data.sample_eval_sets(n, batch, data.make_generator(s, "eval", n)) for s in seeds]
    )


def test_model_shapes_and_masking():
    model = mdl.MaxRetrievalModel([0, 1], width=WIDTH)
    assert model.num_seeds == 2
    assert model.keys.weight.shape == (2, WIDTH, WIDTH)
    sets = _sets([0, 1], 9, 5)
    assert model(sets).shape == (2, 5, data.NUM_CLASSES)
    train_sets = data.stack_sets(
        [data.sample_train_sets(4, data.make_generator(s, "train")) for s in (0, 1)]
    )
    hidden = model.encode_items(train_sets.priority, train_sets.classes)
    assert hidden.shape == (2, 1, 4, 16, WIDTH)
    logits = model.attention_logits(train_sets.query, hidden, train_sets.mask)
    assert logits.shape == (2, 1, 4, 16)
    assert torch.all(torch.isneginf(logits) == ~train_sets.mask)


def test_batched_seeds_equal_separate_runs():
    seeds = [0, 1, 2]
    batched = mdl.MaxRetrievalModel(seeds, width=WIDTH)
    sets = _sets(seeds, 12, 6)
    out = batched(sets)
    for i, s in enumerate(seeds):
        alone = mdl.MaxRetrievalModel([s], width=WIDTH)
        for (name, p_all), (_, p_one) in zip(
            batched.named_parameters(), alone.named_parameters(), strict=True
        ):
            assert torch.equal(p_all[i : i + 1], p_one), name
        one = alone(_sets([s], 12, 6))
        torch.testing.assert_close(out[i : i + 1], one, rtol=1e-5, atol=1e-6)
    # distinct seeds give distinct initial weights
    assert not torch.equal(batched.keys.weight[0], batched.keys.weight[1])


def test_batched_training_equals_separate_training():
    seeds = [4, 7]
    batched = mdl.MaxRetrievalModel(seeds, width=WIDTH)
    mdl.train(batched, 5, batch=8)
    for i, s in enumerate(seeds):
        alone = mdl.MaxRetrievalModel([s], width=WIDTH)
        mdl.train(alone, 5, batch=8)
        for (name, p_all), (_, p_one) in zip(
            batched.named_parameters(), alone.named_parameters(), strict=True
        ):
            torch.testing.assert_close(p_all[i : i + 1], p_one, rtol=1e-4, atol=1e-5, msg=name)


def test_training_lowers_the_loss_and_logs():
    model = mdl.MaxRetrievalModel([0], width=32)
    log = mdl.train(model, 60, batch=64, lr=3e-3, log_every=20)
    assert log.steps == 60 and [s for s, _ in log.history] == [20, 40, 60]
    assert log.history[-1][1][0] < log.history[0][1][0]
    assert not model.training


def test_time_budget_stops_training():
    model = mdl.MaxRetrievalModel([0], width=WIDTH)
    log = mdl.train(model, 10_000, batch=4, max_seconds=0.0)
    assert log.steps == 1 and len(log.final_loss) == 1


# --------------------------------------------------------------------------- evaluation


def test_adaptive_evaluation_with_constant_one_is_the_baseline():
    model = mdl.MaxRetrievalModel([0, 1], width=WIDTH)
    r = mdl.evaluate_size(model, 32, 10, schedule=Constant(1))
    assert np.array_equal(r.adaptive_acc, r.baseline_acc)
    np.testing.assert_allclose(r.adaptive_coef_mean, r.baseline_coef_mean, rtol=1e-12)
    np.testing.assert_array_equal(r.beta_mean, [1.0, 1.0])


def test_adaptive_evaluation_calls_the_library(monkeypatch):
    import softmaxtheory.accelerated.torch as st

    calls = []
    real = st.adaptive_softmax

    def spy(x, dim=-1, **kw):
        calls.append((tuple(x.shape), x.dtype, kw["schedule"]))
        return real(x, dim, **kw)

    monkeypatch.setattr(st, "adaptive_softmax", spy)
    model = mdl.MaxRetrievalModel([0], width=WIDTH)
    mdl.evaluate_size(model, 16, 6, chunk_items=16 * 4)
    assert calls == [
        ((1, 4, 16), torch.float64, PaperPolynomial()),
        ((1, 2, 16), torch.float64, PaperPolynomial()),
    ]


def test_chunking_does_not_change_the_result():
    model = mdl.MaxRetrievalModel([0, 1], width=WIDTH)
    whole = mdl.evaluate_size(model, 64, 9)
    parts = mdl.evaluate_size(model, 64, 9, chunk_items=64 * 2)
    # float32 products may round differently in other chunk shapes: decisions agree exactly
    np.testing.assert_array_equal(whole.baseline_acc, parts.baseline_acc)
    np.testing.assert_array_equal(whole.adaptive_acc, parts.adaptive_acc)
    for key in ("spread_max", "baseline_coef_max", "baseline_coef_mean", "bound"):
        np.testing.assert_allclose(getattr(whole, key), getattr(parts, key), rtol=1e-5)


@pytest.mark.theorem("T1")
def test_max_item_coefficient_never_exceeds_the_t1_bound():
    """Baseline and adaptive max coefficients stay within their T1 bounds at n = 16, 128, 1024."""
    model = mdl.MaxRetrievalModel([0, 1, 2], width=WIDTH)
    mdl.train(model, 20, batch=32, lr=3e-3)
    for n in (16, 128, 1024):
        r = mdl.evaluate_size(model, n, 8)
        assert np.all(r.baseline_coef_max <= r.bound)
        assert np.all(r.baseline_coef_mean <= r.baseline_coef_max)
        np.testing.assert_array_equal(r.bound, bounds.max_coefficient(n, r.spread_max))
        assert np.all(r.adaptive_coef_max <= r.adaptive_bound)
        assert np.all(r.spread_mean <= r.spread_max)
        # the bound is not vacuous for these small untrained logits
        assert np.all(r.bound < 1.0)


@pytest.mark.theorem("T1")
def test_a_coefficient_above_the_bound_is_reported(monkeypatch):
    """evaluate_size raises BoundViolation when a coefficient exceeds a (patched) T1 bound."""
    monkeypatch.setattr(bounds, "max_coefficient", lambda n, spread: np.full(len(spread), 1e-9))
    model = mdl.MaxRetrievalModel([0], width=WIDTH)
    with pytest.raises(mdl.BoundViolation, match="T1 violated at n=16"):
        mdl.evaluate_size(model, 16, 4)


# --------------------------------------------------------------------------- statistics


def test_paired_ttest_matches_a_hand_computation():
    a = [0.80, 0.75, 0.90]
    b = [0.78, 0.70, 0.86]
    d = np.subtract(a, b)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    # Student t with 2 degrees of freedom: P(|T| >= t) = 1 - t / sqrt(2 + t^2)
    hand = 1.0 - abs(t) / math.sqrt(2.0 + t * t)
    p, note = rep.paired_ttest(a, b)
    assert note == "" and p == pytest.approx(hand, rel=1e-10)
    assert rep.paired_ttest(b, a)[0] == pytest.approx(hand, rel=1e-10)


def test_paired_ttest_degenerate_cases():
    assert _nan_with(rep.paired_ttest([0.5, 0.6, 0.7], [0.5, 0.6, 0.7]), "no difference")
    # the same difference in every seed: the limit |t| -> inf, which near-equal differences
    # approach (how many seeds a verdict needs is the caller's rule: clrs_text.report)
    assert rep.paired_ttest([0.6, 0.7, 0.8], [0.5, 0.6, 0.7]) == (
        0.0,
        "same difference in every seed",
    )
    near = rep.paired_ttest([0.6, 0.7, 0.8], [0.5, 0.6, 0.70001])
    assert near[1] == "" and 0.0 < near[0] < 1e-4
    assert _nan_with(rep.paired_ttest([0.6], [0.5]), "fewer than 2")
    with pytest.raises(ValueError, match="equal length"):
        rep.paired_ttest([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="finite"):
        rep.paired_ttest([0.1, float("nan")], [0.1, 0.2])


def _nan_with(result, text):
    p, note = result
    return math.isnan(p) and text in note


def test_summarize_rows_and_paper_columns():
    model = mdl.MaxRetrievalModel([0, 1], width=WIDTH)
    rows = rep.summarize([mdl.evaluate_size(model, n, 5) for n in (16, 8192)])
    assert [r["n"] for r in rows] == [16, 8192]
    assert set(rows[0]) == set(rep.CSV_COLUMNS)
    assert rows[0]["paper_baseline"] == 98.6 and rows[1]["paper_adaptive"] is None
    assert rows[0]["paper_p_value"] == 0.4 and rows[1]["paper_p_value"] is None
    for r in rows:
        assert 0.0 <= r["baseline_mean"] <= 100.0
        assert r["max_item_coef_largest"] <= r["t1_bound"]


def test_progress_bar_without_a_terminal():
    stream = io.StringIO()
    bar = rep.Progress(50, "train", stream=stream)
    for k in range(1, 51):
        bar.update(k, "loss 1.0" if k == 50 else None)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("train [####")
    assert "100.0% 50/50" in lines[-1] and lines[-1].endswith("loss 1.0")
    quiet = io.StringIO()
    rep.Progress(5, "x", stream=quiet, enabled=False).update(5)
    assert quiet.getvalue() == ""


# --------------------------------------------------------------------------- configuration and CLI


def test_configs_and_overrides():
    quick = mr.CONFIGS["quick"]
    assert quick.sizes == tuple(16 * 2**k for k in range(11))
    assert mr.CONFIGS["full"].seeds == 10
    assert quick.sets_for(16) == quick.eval_sets
    assert quick.sets_for(16384) == max(quick.min_eval_sets, quick.eval_items // 16384)
    ns = argparse.Namespace(
        config="full",
        seeds=2,
        steps=7,
        sizes=(16,),
        eval_sets=3,
        eval_items=0,
        seed=4,
        max_minutes=0.5,
    )
    cfg = mr.resolve_config(ns)
    assert (cfg.seeds, cfg.steps, cfg.sizes, cfg.eval_sets) == (2, 7, (16,), 3)
    assert (cfg.eval_items, cfg.base_seed, cfg.max_minutes) == (None, 4, 0.5)
    assert cfg.sets_for(10**6) == 3


TINY = [
    "reproduce",
    "max-retrieval",
    "--seeds",
    "2",
    "--steps",
    "3",
    "--sizes",
    "32,16",
    "--eval-sets",
    "4",
    "--device",
    "cpu",
    "--no-progress",
]


def test_cli_end_to_end(tmp_path, capsys):
    assert cli.main([*TINY, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "98.6" in out and "97.1" in out and "T1 bound" in out
    with (tmp_path / "max_retrieval.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["n"] for r in table] == ["16", "32"]
    assert list(table[0]) == list(rep.CSV_COLUMNS)
    assert table[0]["paper_baseline"] == "98.6" and table[0]["eval_sets"] == "4"
    assert (tmp_path / "max_retrieval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / "max_retrieval.json").read_text())
    assert record["train"]["steps"] == 3 and len(record["per_seed"]) == 2


def test_cli_json(tmp_path, capsys):
    assert cli.main([*TINY, "--json", "--out", str(tmp_path / "new" / "dir")]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [r["n"] for r in record["sizes"]] == [16, 32]
    assert record["config"]["seeds"] == 2 and record["config"]["eval_sets"] == 4


def test_cli_cuda_without_cuda(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = [*TINY, "--out", str(tmp_path)]
    args[args.index("cpu")] = "cuda"
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "Traceback" not in err


def test_cli_out_is_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert cli.main([*TINY, "--out", str(target)]) == 2
    assert "cannot create the folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--seeds", "0", "positive integer"),
        ("--steps", "-5", "positive integer"),
        ("--sizes", "16,abc", "comma-separated integers"),
        ("--sizes", "0,16", "integers >= 1"),
        ("--eval-sets", "x", "positive integer"),
        ("--max-minutes", "0", "positive number"),
        ("--device", "tpu", "invalid choice"),
        ("--config", "huge", "invalid choice"),
    ],
)
def test_cli_bad_arguments(flag, value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "max-retrieval", flag, value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
