"""``softmaxtheory bench --section attention``: the torch attention paths on CPU tensors."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from softmaxtheory.bench import attention  # noqa: E402
from softmaxtheory.cli import main  # noqa: E402


def test_quick_run_times_every_case_of_every_row(capsys, tmp_path) -> None:
    saved = tmp_path / "attention.json"
    code = main(["bench", "--section", "attention", "--quick", "--repeat", "1", "--json",
                 "--output", str(saved)])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0
    doc = json.loads(out.out)
    assert json.loads(saved.read_text()) == doc
    assert doc["run"]["sections"] == ["attention"] and doc["run"]["attention_repeat"] == 1
    rows = doc["attention"]
    shape = list(attention.QUICK_ATTENTION_SHAPES[0])
    assert [(r["shape"], r["pass"], r["causal"]) for r in rows] == [
        (shape, p, c) for p in ("forward", "forward+backward") for c in (False, True)
    ]
    for row in rows:
        assert list(row["cases"]) == list(attention.FORWARD_CASES)
        assert row["threads"] == torch.get_num_threads() and row["dtype"] == "float32"
        sdpa = row["cases"]["sdpa"]["seconds"]
        for case in row["cases"].values():
            assert case["seconds"] > 0
            assert case["ratio_to_sdpa"] == pytest.approx(case["seconds"] / sdpa, rel=1e-12)
    assert "timing attention_entropy (forward+backward)" in out.err


def test_table_names_each_case_and_a_failure_alone(monkeypatch, capsys) -> None:
    """A case that raises is recorded with its error; the others are timed."""
    cases = attention.attention_cases

    def failing_hybrid(*args, **kwargs):
        out = cases(*args, **kwargs)

        def fail():
            raise RuntimeError("no kernel for this")

        return {**out, "hybrid": fail}

    monkeypatch.setattr(attention, "attention_cases", failing_hybrid)
    code = main(["bench", "--section", "attention", "--quick", "--repeat", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert any(line.startswith("(B, H, L, S, D)") and "x SDPA" in line for line in lines)
    hybrid = [line for line in lines if " hybrid " in line]
    assert len(hybrid) == 4 and all("failed: RuntimeError: no kernel for this" in h for h in hybrid)
    entropy = [line for line in lines if " attention_entropy " in line]
    assert len(entropy) == 4
    assert all(float(line.split()[-2]) > 0 for line in entropy)  # (ms, then the ratio)


def test_backward_cases_differentiate_every_operand_they_read(monkeypatch) -> None:
    """Forward + backward cases run a backward that reaches q, k (and v where it is read)
    with finite gradients, at every call."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    grads = []
    requires_grad = torch.Tensor.requires_grad_

    def hooked(t, flag=True):  # the cases' leaves: record each gradient they receive
        t = requires_grad(t, flag)
        t.register_hook(grads.append)
        return t

    monkeypatch.setattr(torch.Tensor, "requires_grad_", hooked)
    cases = attention.attention_cases(torch, q, k, v, causal=True, backward=True)
    monkeypatch.undo()
    for name, run in cases.items():
        for _ in range(2):
            grads.clear()
            run()
            assert len(grads) == (2 if name == "attention_entropy" else 3), name
            assert all(torch.isfinite(grad).all() and grad.abs().sum() > 0 for grad in grads)


def test_threads_apply_to_the_run_and_are_restored() -> None:
    before = torch.get_num_threads()
    rows = attention.run_attention(attention.QUICK_ATTENTION_SHAPES, 1, threads=1)
    assert {r["threads"] for r in rows} == {1}
    assert torch.get_num_threads() == before
