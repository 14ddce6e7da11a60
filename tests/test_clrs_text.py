"""The CLRS-Text experiment: generator format and semantics, the variants' attention, the CLI."""

from __future__ import annotations

import argparse
import csv
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

from softmaxtheory import cli  # noqa: E402
from softmaxtheory.experiments import clrs_text as ct  # noqa: E402
from softmaxtheory.experiments.clrs_text import data  # noqa: E402
from softmaxtheory.experiments.clrs_text import model as mdl  # noqa: E402
from softmaxtheory.experiments.clrs_text import report as rep  # noqa: E402
from softmaxtheory.spec import Constant, PaperPolynomial  # noqa: E402

ALGOS = data.ALGORITHMS


def _draw(algo, n, seed=0, use_hints=True):
    return data.sample(
        algo, n, data.make_rng(seed, "eval", ALGOS.index(algo), n), use_hints=use_hints
    )


# --------------------------------------------------------------------------- generator: format


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("use_hints", [True, False])
def test_format_matches_the_benchmark_regexes(algo, use_hints):
    """The question/answer patterns the benchmark's own generator test asserts
    (``clrs/_src/clrs_text/huggingface_generators_test.py``)."""
    for n in (3, 5, 7):
        s = _draw(algo, n, use_hints=use_hints)
        assert s.algorithm == algo and s.size == n
        assert s.question.startswith(f"{algo}:\n") and s.question.endswith(":\n")
        assert s.answer.endswith("\n\n") and s.text == s.question + s.answer
        if use_hints:
            assert re.fullmatch(rf"{algo}:\n.*?initial_trace:.*?\ntrace \| .*?:\n", s.question)
            assert re.fullmatch(r"[^a-zA-Z]*\|[^a-zA-Z]*\n\n", s.answer)
        else:
            assert "initial_trace:" not in s.question and "trace | " not in s.question
            assert re.fullmatch(r"[^a-zA-Z|]*\n\n", s.answer)
        mdl.encode(s.text)  # every character is in the vocabulary


def test_published_examples_without_trace():
    """The examples of ``clrs_utils.sample_to_str``'s docstring, rendered here."""
    keys = np.array([0.549, 0.715, 0.603, 0.545, 0.424])
    s = data.format_example("insertion_sort", data.TRACERS["insertion_sort"](keys), 5, False)
    assert s.question == "insertion_sort:\nkey: [0.549 0.715 0.603 0.545 0.424]\npred:\n"
    assert s.answer == "[0.424 0.545 0.549 0.603 0.715]\n\n"
    sorted_keys = np.sort(keys)
    s = data.format_example(
        "binary_search", data.TRACERS["binary_search"](sorted_keys, 0.646), 5, False
    )
    assert s.question == (
        "binary_search:\nkey: [0.424 0.545 0.549 0.603 0.715], target: 0.646\nreturn:\n"
    )
    assert s.answer == "4\n\n"
    kadane = np.array([0.098, 0.43, 0.206, 0.09, -0.153])
    trace = data.TRACERS["find_maximum_subarray_kadane"](kadane)
    s = data.format_example("find_maximum_subarray_kadane", trace, 5, False)
    assert s.question.endswith("key: [0.098 0.43 0.206 0.09 -0.153]\nstart, end:\n")
    assert s.answer == "0, 3\n\n"


def test_published_insertion_sort_trace():
    """The docstring's insertion-sort trace: the states after each insertion. The
    benchmark's code puts the first recorded state in the question and drops the
    last (it equals the output), so the answer holds the middle states."""
    keys = np.array([0.549, 0.715, 0.603, 0.545, 0.424])
    trace = data.TRACERS["insertion_sort"](keys)
    published = [
        "[0.549 0.715 0.603 0.545 0.424]",
        "[0.549 0.603 0.715 0.545 0.424]",
        "[0.545 0.549 0.603 0.715 0.424]",
        "[0.424 0.545 0.549 0.603 0.715]",
    ]
    assert trace.hints == ["[0.549 0.715 0.603 0.545 0.424]", *published]
    s = data.format_example("insertion_sort", trace, 5)
    assert s.question == (
        "insertion_sort:\nkey: [0.549 0.715 0.603 0.545 0.424], "
        "initial_trace: [0.549 0.715 0.603 0.545 0.424]\ntrace | pred:\n"
    )
    assert s.answer == ", ".join(published[:-1]) + " | " + published[-1] + "\n\n"


def test_search_traces_are_parenthesised():
    s = data.format_example(
        "binary_search", data.TRACERS["binary_search"](np.array([0.1, 0.2, 0.3, 0.4]), 0.35), 4
    )
    assert s.question.endswith("target: 0.350, initial_trace: (0, 3)\ntrace | (low, high):\n")
    assert s.answer == "(2, 3) | (3, 3)\n\n"


# --------------------------------------------------------------------------- generator: semantics


def _numbers(text):
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", text)]


@pytest.mark.parametrize("algo", ["insertion_sort", "bubble_sort", "heapsort", "quicksort"])
def test_sort_traces_are_permutations_ending_sorted(algo):
    for seed in range(5):
        s = _draw(algo, 6, seed)
        keys = _numbers(s.question.split("initial_trace")[0])
        assert len(keys) == 6
        steps = re.findall(r"\[[^\]]*\]", s.answer)
        for step in steps:
            assert sorted(_numbers(step)) == sorted(keys)
        assert _numbers(steps[-1]) == sorted(keys)
    trace = data.TRACERS["bubble_sort"](np.array([0.4, 0.3, 0.2, 0.1, 0.05]))
    assert len(trace.hints) == 1 + 5 * 4 // 2  # one probe per comparison


def test_minimum_search_and_kadane_outputs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        keys = np.trunc(rng.uniform(0, 1, 7) * 1000) / 1000
        assert data.TRACERS["minimum"](keys).plain_output == str(int(np.argmin(keys)))
        srt = np.sort(keys)
        target = float(rng.uniform())
        expect = min(int(np.searchsorted(srt, target, side="left")), 6)
        assert data.TRACERS["binary_search"](srt, target).plain_output == str(expect)
        signed = keys * 2 - 1
        lo, hi = (
            int(x)
            for x in data.TRACERS["find_maximum_subarray_kadane"](signed).plain_output.split(", ")
        )
        best = max(signed[i : j + 1].sum() for i in range(7) for j in range(i, 7))
        assert signed[lo : hi + 1].sum() == pytest.approx(best)


def test_kruskal_output_is_a_minimum_spanning_forest():
    from scipy.sparse.csgraph import minimum_spanning_tree

    rng = np.random.default_rng(1)
    for n in (3, 5, 7):
        for _ in range(5):
            weights = data._draw_graph(rng, n)
            trace = data.TRACERS["mst_kruskal"](weights)
            tree = np.array([_numbers(row) for row in re.findall(r"\[([^\[\]]*)\]", trace.output)])
            assert tree.shape == (n, n) and np.array_equal(tree, tree.T)
            upper = np.triu(weights, 1)
            ref = minimum_spanning_tree(upper).toarray().sum()
            assert np.triu(tree * weights, 1).sum() == pytest.approx(ref)


def test_sizes_and_determinism():
    for algo in ALGOS:
        a, b = _draw(algo, 5, seed=3), _draw(algo, 5, seed=3)
        assert a == b
        c = _draw(algo, 5, seed=4)
        assert c != a
        first_input = a.question.split("\n")[1].split(", initial_trace")[0]
        if algo == "mst_kruskal":
            assert first_input.count("[") == 1 + 5
        else:
            assert len(_numbers(first_input.split("target")[0])) == 5
    with pytest.raises(ValueError, match="algorithm"):
        data.sample("dfs", 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="size"):
        data.sample("minimum", 1, np.random.default_rng(0))


def test_encoding_and_answer_mask():
    with pytest.raises(ValueError, match="vocabulary"):
        mdl.encode("key: #")
    pairs = [("ab:\n", "1\n\n"), ("abc:\n", "12\n\n")]
    inputs, targets, answer = mdl.encode_batch(pairs)
    assert inputs.shape == (2, 8)
    assert mdl.decode(targets[1][answer[1]].tolist()) == "12\n\n"
    assert mdl.decode(targets[0][answer[0]].tolist()) == "1\n\n"
    assert mdl.decode(inputs[0].tolist()) == "ab:\n1\n"


# --------------------------------------------------------------------------- model and attention


def _tokens(model, length=24, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, len(mdl.VOCAB), (model.num_models, batch, length), generator=g)


def test_plain_variant_is_softmax_attention(monkeypatch):
    """The softmax variant runs the library kernel with Constant(1): it equals SDPA."""
    model = mdl.ClrsTextModel([0, 1], width=16, layers=2, heads=2)
    x = _tokens(model)
    plain = [Constant(1.0)] * model.num_models
    with torch.no_grad():
        ours = model(x, plain)
        monkeypatch.setattr(
            mdl,
            "attention",
            lambda q, k, v, s: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True
            ),
        )
        sdpa = model(x, plain)
    torch.testing.assert_close(ours, sdpa, rtol=1e-5, atol=1e-5)


def test_adaptive_variant_matches_the_reference_on_sampled_rows(monkeypatch):
    """The adaptive heads of the model equal the certified reference on sampled query rows."""
    from softmaxtheory.reference import adaptive_attention as ref_attention

    model = mdl.ClrsTextModel([0], width=16, layers=1, heads=2)
    x = _tokens(model, length=20, batch=1)
    seen = []
    kernel = mdl.attention

    def spy(q, k, v, schedule):
        out = kernel(q, k, v, schedule)
        seen.append((q, k, v, out, schedule))
        return out

    monkeypatch.setattr(mdl, "attention", spy)
    with torch.no_grad():
        model(x, [Constant(1.0), PaperPolynomial()])
    q, k, v, out, schedule = seen[1]
    assert isinstance(schedule, PaperPolynomial)
    betas = []
    for head, row in [(0, 5), (1, 12), (0, 19)]:
        qi = q[0, 0, head, row : row + 1].double().numpy()
        ki = k[0, 0, head, : row + 1].double().numpy()
        vi = v[0, 0, head, : row + 1].double().numpy()
        expect = ref_attention(qi, ki, vi)
        np.testing.assert_allclose(out[0, 0, head, row].numpy(), expect[0], rtol=2e-5, atol=2e-6)
        logits = (qi @ ki.T)[0] / np.sqrt(qi.shape[-1])
        p = np.exp(logits - logits.max())
        p /= p.sum()
        betas.append(float(PaperPolynomial().beta_float(-(p * np.log(p)).sum(), row + 1)))
    assert max(betas) > 1.0  # the rows checked do sharpen


def test_copies_of_a_seed_start_equal_and_seeds_are_independent():
    model = mdl.ClrsTextModel([3, 5], width=16, layers=1, heads=2)
    alone = mdl.ClrsTextModel([5], width=16, layers=1, heads=2)
    for name, p in model.named_parameters():
        assert torch.equal(p[1], p[3]), name  # seed 5, copies 0 and 1
        assert torch.equal(p[1], dict(alone.named_parameters())[name][0]), name
    assert not torch.equal(model.embed[0], model.embed[1])


def test_gradient_clipping_is_per_model():
    model = mdl.ClrsTextModel([0], width=8, layers=1, heads=2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
        p.grad[1] *= 1e-4
    norms = mdl.clip_per_model(model, 1.0)
    after = mdl.clip_per_model(model, 1e9)
    assert float(norms[0]) > 10 and float(after[0]) == pytest.approx(1.0, rel=1e-5)
    assert float(after[1]) == pytest.approx(float(norms[1]), rel=1e-6)  # untouched


def test_batched_training_equals_training_a_seed_alone():
    kwargs = dict(algorithms=("minimum", "binary_search"), sizes=(3,), batch=3, warmup=1)
    sched = [Constant(1.0), PaperPolynomial()]
    both = mdl.ClrsTextModel([0, 1], width=8, layers=1, heads=2)
    alone = mdl.ClrsTextModel([1], width=8, layers=1, heads=2)
    mdl.train(both, [sched[0]] * 2 + [sched[1]] * 2, 3, lr=5e-2, **kwargs)
    mdl.train(alone, sched, 3, lr=5e-2, **kwargs)
    mine = dict(alone.named_parameters())
    for name, p in both.named_parameters():
        torch.testing.assert_close(p[1], mine[name][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(p[3], mine[name][1], rtol=1e-4, atol=1e-5)


def test_training_lowers_the_loss_and_keeps_copies_apart():
    model = mdl.ClrsTextModel([0], width=16, layers=1, heads=2)
    log = mdl.train(
        model,
        [Constant(1.0), PaperPolynomial()],
        12,
        algorithms=("minimum",),
        sizes=(3,),
        batch=4,
        lr=1e-2,
        warmup=1,
        log_every=4,
    )
    assert log.steps == 12 and len(log.history) == 3
    first, last = log.history[0][1], log.history[-1][1]
    assert all(b < a for a, b in zip(first, last, strict=True))
    assert not torch.equal(model.embed[0], model.embed[1])  # the two schedules train apart
    ev = mdl.evaluate(model, "minimum", 4, 3)
    assert set(ev.token_acc) == set(rep.VARIANTS) and ev.token_acc["softmax"].shape == (1,)
    for metric in (ev.token_acc, ev.exact, ev.output_exact):
        assert all(0.0 <= float(v[0]) <= 1.0 for v in metric.values())


def test_untrained_variants_score_alike_and_below_one():
    """Both copies of a seed start from the same weights, so untrained, "adaptive" and
    "inference_only" are one computation and score alike; no answer token is right, so no
    final output is. The adaptive output score was 1.0 whatever the model wrote: its rows of
    the output mask were empty."""
    model = mdl.ClrsTextModel([0, 1], copies=2, width=16, layers=1, heads=1)
    ev = mdl.evaluate(model, "minimum", 8, 8)
    for metric in (ev.token_acc, ev.exact, ev.output_exact):
        np.testing.assert_array_equal(metric["adaptive"], metric["inference_only"])
    assert np.all(ev.token_acc["adaptive"] == 0.0)
    assert np.all(ev.output_exact["adaptive"] == 0.0)


# --------------------------------------------------------------------------- report


class _Ev:
    def __init__(self, algo, size, soft, adapt, inf):
        self.algorithm, self.size, self.examples, self.answer_tokens = algo, size, 4, 10.0
        scores = {"softmax": np.array(soft), "adaptive": np.array(adapt)}
        scores["inference_only"] = np.array(inf)
        self.token_acc = self.exact = self.output_exact = scores


def test_summarize_and_findings():
    evs = [
        _Ev("heapsort", 3, [0.9, 0.8, 0.7], [0.9, 0.8, 0.7], [0.9, 0.8, 0.7]),
        _Ev("heapsort", 5, [0.5, 0.4, 0.3], [0.61, 0.5, 0.42], [0.5, 0.4, 0.3]),
        _Ev("minimum", 5, [0.5, 0.4, 0.3], [0.4, 0.31, 0.19], [0.52, 0.38, 0.3]),
    ]
    rows = rep.summarize(evs, train_sizes=(3,))
    assert [r["in_distribution"] for r in rows] == [True, False, False]
    assert rows[0]["p_adaptive_note"] == "no difference in any seed"
    assert rows[1]["adaptive_token_acc_mean"] == pytest.approx(51.0)
    assert rows[1]["p_adaptive"] < 0.05
    found = {f["algorithm"]: f for f in rep.findings(rows)}
    assert found["heapsort"]["paper"] == "worse" and found["heapsort"]["adaptive_here"] == "better"
    assert found["minimum"]["adaptive_here"] == "worse"
    assert found["minimum"]["inference_only_here"] == "no clear difference"
    assert found["heapsort"]["adaptive_gain"] == pytest.approx(11.0)
    assert "heapsort" in rep.format_table(rows, list(found.values()))


@pytest.mark.parametrize(
    "infer", [[5 / 13, 6 / 13], [0.3077 + 0.0209, 0.3846 + 0.0224]], ids=["same", "near"]
)
def test_two_seeds_give_no_verdict(infer):
    """Two seeds, the inference-only copy ahead in each by one token of 13 (the same gain: p
    printed as 0) or by 2.09 and 2.24 points (p = 0.02): both rows read "better". A t-test on
    two seeds estimates its variance from one difference."""
    evs = [_Ev("minimum", 5, [0.3077, 0.3846], [0.3077, 0.3846], infer)]
    rows = rep.summarize(evs, train_sizes=(3,))
    assert rows[0]["seeds"] == 2 and rows[0]["p_inference_only"] < 0.05
    (found,) = rep.findings(rows)
    assert found["inference_only_here"] == "too few seeds"
    assert found["inference_only_better"] == 0
    table = rep.format_table(rows, [found])
    assert "2 seeds: too few for a verdict (at least 3;" in table


# --------------------------------------------------------------------------- configuration and CLI


def test_configs_and_overrides():
    quick, full = ct.CONFIGS["quick"], ct.CONFIGS["full"]
    assert set(quick.algorithms) == set(ALGOS) and len(ALGOS) >= 8
    assert {"heapsort", "mst_kruskal", "bubble_sort"} <= set(ALGOS)
    assert max(quick.train_sizes) < max(quick.eval_sizes)
    assert max(full.train_sizes) < max(full.eval_sizes) and full.seeds > quick.seeds
    ns = argparse.Namespace(config="full", seeds=2, steps=7, algorithms=("minimum",), width=8)
    cfg = ct.resolve_config(ns)
    assert (cfg.seeds, cfg.steps, cfg.algorithms, cfg.width) == (2, 7, ("minimum",), 8)
    with pytest.raises(ValueError, match="--width"):
        ct.resolve_config(argparse.Namespace(config="quick", width=10, heads=4))


TINY = [
    "reproduce",
    "clrs-text",
    "--algorithms",
    "minimum,binary_search",
    "--seeds",
    "2",
    "--steps",
    "3",
    "--train-sizes",
    "3",
    "--eval-sizes",
    "4,3",
    "--eval-examples",
    "2",
    "--batch",
    "2",
    "--width",
    "8",
    "--layers",
    "1",
    "--heads",
    "2",
    "--device",
    "cpu",
    "--no-progress",
]


def test_cli_end_to_end(tmp_path, capsys):
    assert cli.main([*TINY, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "minimum" in out and "binary_search" in out and "paper" in out
    with (tmp_path / "clrs_text.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [(r["algorithm"], r["size"]) for r in table] == [
        ("minimum", "3"),
        ("minimum", "4"),
        ("binary_search", "3"),
        ("binary_search", "4"),
    ]
    assert list(table[0]) == list(rep.CSV_COLUMNS)
    assert table[0]["in_distribution"] == "1" and table[1]["in_distribution"] == "0"
    assert (tmp_path / "clrs_text.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / "clrs_text.json").read_text())
    assert record["train"]["steps"] == 3 and len(record["per_seed"]) == 4
    assert [f["algorithm"] for f in record["findings"]] == ["minimum", "binary_search"]


def test_cli_json_and_errors(tmp_path, capsys, monkeypatch):
    assert cli.main([*TINY, "--json", "--out", str(tmp_path / "a" / "b")]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["config"]["seeds"] == 2 and record["config"]["eval_sizes"] == [3, 4]
    target = tmp_path / "file"
    target.write_text("x")
    assert cli.main([*TINY, "--out", str(target)]) == 2
    assert "cannot create the folder" in capsys.readouterr().err
    assert cli.main([*TINY, "--width", "6", "--heads", "4"]) == 2
    assert "--width" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = [*TINY, "--out", str(tmp_path)]
    args[args.index("cpu")] = "cuda"
    assert cli.main(args) == 2
    assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--algorithms", "minimum,dfs", "subset of"),
        ("--eval-sizes", "1,4", "integers >= 2"),
        ("--train-sizes", "3,x", "comma-separated"),
        ("--seeds", "0", "positive integer"),
        ("--config", "huge", "invalid choice"),
    ],
)
def test_cli_bad_arguments(flag, value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "clrs-text", flag, value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_docs_page_example_and_constants_follow_the_code():
    """The docs page shows an example drawn by the generator and computes the
    parameter count with a vocabulary of 50: both must follow the code."""
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "experiments" / "clrs_text.rst").read_text(
        encoding="utf-8"
    )
    s = data.sample("bubble_sort", 4, data.make_rng(1, "eval", ALGOS.index("bubble_sort"), 4))
    block = "\n".join("   " + line for line in s.text.rstrip("\n").split("\n"))
    assert block in page
    assert len(mdl.VOCAB) == 50 and "vocab = 50" in page
    for width, layers in ((32, 2), (16, 1)):
        model = mdl.ClrsTextModel([0], copies=1, width=width, layers=layers, heads=2)
        count = sum(p.numel() for p in model.parameters())
        assert count == layers * (12 * width**2 + 13 * width) + 2 * width + 2 * 50 * width + 50
