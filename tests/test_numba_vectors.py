"""The CPU kernels' vector width (``accelerated/_numba_vectors.py``).

Every kernel is compiled by the pipeline that marks its functions with LLVM's
``"prefer-vector-width"="512"``, so that on a processor with AVX-512 the kernels use its
512-bit registers as ``torch.softmax`` does (LLVM's own tuning stops at 256 bits there);
a user's own Numba functions in the same process are compiled as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from softmaxtheory.accelerated import _cpu_kernels, _dask_blocks  # noqa: E402
from softmaxtheory.accelerated._numba_cache import njit  # noqa: E402
from softmaxtheory.accelerated._numba_vectors import ATTRIBUTE, PIPELINE  # noqa: E402


def _dispatchers(module):
    return {
        name: f
        for name, f in vars(module).items()
        if isinstance(f, numba.core.registry.CPUDispatcher)
    }


@pytest.mark.parametrize("module", [_cpu_kernels, _dask_blocks], ids=lambda m: m.__name__)
def test_every_kernel_is_compiled_by_the_pipeline(module) -> None:
    kernels = _dispatchers(module)
    assert len(kernels) >= (40 if module is _cpu_kernels else 2)
    # Numba keeps a dispatcher's pipeline with its compiler
    other = sorted(n for n, f in kernels.items() if f._compiler.pipeline_class is not PIPELINE)
    assert not other, other


def _sum_rows(x, out):
    for i in numba.prange(x.shape[0]):
        s = x.dtype.type(0)
        for j in range(x.shape[1]):
            s += np.exp(x[i, j])
        out[i] = s


def test_the_kernels_functions_carry_the_attribute_and_a_users_do_not() -> None:
    """The attribute is in the IR of a function compiled through the kernels' ``njit``,
    serial and parallel, and in no function that plain ``numba.njit`` compiles after it
    in the same process."""
    x = np.linspace(-1.0, 0.0, 64, dtype=np.float32).reshape(4, 16)
    for parallel in (False, True):
        ours = njit(parallel=parallel, fastmath={"contract"})(_sum_rows)
        theirs = numba.njit(parallel=parallel, fastmath={"contract"})(_sum_rows)
        got, want = np.empty(4, np.float32), np.empty(4, np.float32)
        ours(x, got)
        theirs(x, want)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        (sig,) = ours.signatures
        assert ATTRIBUTE in ours.inspect_llvm(sig), parallel
        assert "prefer-vector-width" not in theirs.inspect_llvm(theirs.signatures[0]), parallel


def _has_avx512() -> bool:
    import llvmlite.binding as llvm

    return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")


def test_a_loop_uses_512_bit_registers_exactly_where_the_processor_has_them() -> None:
    """On a processor with AVX-512 the kernels' loops run on zmm registers (LLVM's tuning
    alone gave ymm); without it the attribute changes nothing and no zmm appears. A
    child process, so that the code is compiled here and not read from a cache."""
    code = textwrap.dedent(
        """
        import re
        import numpy as np
        from softmaxtheory.accelerated._numba_cache import njit

        def scale(x, c, out):
            for i in range(x.shape[0]):
                out[i] = x[i] * c

        f = njit(cache=False, fastmath={"contract"})(scale)
        x = np.ones(1000, np.float32)
        f(x, np.float32(2.0), np.empty_like(x))
        print(len(re.findall(r"%zmm", f.inspect_asm(f.signatures[0]))))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    zmm = int(run.stdout.split()[-1])
    assert (zmm > 0) == _has_avx512(), (zmm, _has_avx512())


def test_switching_the_mark_off_compiles_as_llvm_tuning_would(monkeypatch) -> None:
    """``tools/vector_width.py`` times LLVM's own choice by replacing ``_mark``: the
    pipeline looks it up at each compilation, so a function compiled then has no
    attribute."""
    from softmaxtheory.accelerated import _numba_vectors

    monkeypatch.setattr(_numba_vectors, "_mark", lambda module: None)
    f = njit(cache=False)(_sum_rows)
    f(np.zeros((2, 3)), np.empty(2))
    assert "prefer-vector-width" not in f.inspect_llvm(f.signatures[0])


def test_the_tool_gives_each_build_an_empty_cache_of_its_own(monkeypatch, tmp_path) -> None:
    from tests.support.scripts import load_script

    tool = load_script("tools/vector_width.py", "vector_width_tool")
    seen = []

    def run(cmd, env, check, stdout):
        cache = env["NUMBA_CACHE_DIR"]
        seen.append((cmd[3], cmd[4], cache, sorted(os.listdir(cache))))

    monkeypatch.setattr(tool.subprocess, "run", run)
    assert tool.main(["--out", str(tmp_path)]) == 0
    assert [(b, o) for b, o, _, _ in seen] == [
        ("llvm", str(tmp_path / "bench_cpu_llvm_tuning.json")),
        ("library", str(tmp_path / "bench_cpu.json")),
    ]
    caches = [c for _, _, c, _ in seen]
    assert len(set(caches)) == 2 and all(listing == [] for *_, listing in seen)
    assert not any(os.path.exists(c) for c in caches)  # removed after each run


#: The tool's child with the benchmark replaced by one call of the kernel it checks.
_STUB = """
import sys
import numpy as np
import softmaxtheory.cli
import softmaxtheory.accelerated._numba_vectors as vectors

def main(argv):
    from softmaxtheory.accelerated import cpu
    cpu.adaptive_softmax(np.ones((64, 16384), np.float32))
    return 0

softmaxtheory.cli.main = main
if sys.argv[3:] == ["unmarked"]:  # a build that says 'library' but is not marked
    vectors._mark = lambda module: None
"""


@pytest.mark.parametrize(
    ("build", "extra", "ok"),
    [("llvm", [], True), ("library", [], True), ("library", ["unmarked"], False)],
)
def test_the_tools_child_checks_the_build_it_timed(tmp_path, build, extra, ok) -> None:
    """Each child of ``tools/vector_width.py`` checks, after timing, that the kernel it
    timed carries the attribute exactly in the library's build (so a run that read
    another build's machine code from a cache, or a pipeline that stopped marking,
    does not pass as a measurement of the other)."""
    from tests.support.scripts import load_script

    tool = load_script("tools/vector_width.py", "vector_width_tool")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-c", _STUB + tool.CHILD, build, str(tmp_path / "out.json"), *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert (run.returncode == 0) == ok, run.stderr
    if not ok:
        assert "library build: the attribute in rows_adaptive's IR: [False]" in run.stderr


def test_every_kernel_cache_keys_its_entries_by_the_pipeline() -> None:
    from softmaxtheory.accelerated._numba_cache import PipelineKeyedCache
    from softmaxtheory.accelerated._numba_vectors import PIPELINE_KEY

    kernels = [*_dispatchers(_cpu_kernels).values(), *_dispatchers(_dask_blocks).values()]
    kernels += list(_cpu_kernels.serial_twins().values())
    cached = [d for d in kernels if getattr(d._cache, "_cache_file", None) is not None]
    assert len(cached) > 60 and all(type(d._cache) is PipelineKeyedCache for d in cached)
    sig = (numba.types.float64,)
    key = cached[0]._cache._index_key(sig, _cpu_kernels.exp64.targetctx.codegen())
    assert key[-1] == PIPELINE_KEY


_MODULE = """
def plus_one(x):
    return x + 1
"""

_LOAD = """
import sys
import numba
sys.path.insert(0, sys.argv[1])
import mod
if sys.argv[2] == "plain":
    f = numba.njit(cache=True)(mod.plus_one)
else:
    from softmaxtheory.accelerated._numba_cache import njit
    f = njit(cache=True)(mod.plus_one)
assert f(1) == 2
print(sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values()))
"""


def test_machine_code_cached_without_the_pipeline_is_not_loaded(tmp_path) -> None:
    """A cache entry that plain ``numba.njit`` wrote for a function (the same source
    file, stamp and signature) is not loaded by the kernels' ``njit``, which compiles
    and caches its own; then it loads its own. (Without the pipeline in the key, the
    second step loaded the plain entry: machine code without the 512-bit preference.)"""
    (tmp_path / "mod.py").write_text(_MODULE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def load(kind: str) -> list[int]:
        cmd = [sys.executable, "-c", _LOAD, str(tmp_path), kind]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        return [int(v) for v in run.stdout.split()]

    assert load("plain") == [0, 1]  # compiled and saved
    assert load("plain") == [1, 0]  # plain Numba loads its own entry
    assert load("ours") == [0, 1]  # not that entry: compiled with the pipeline
    assert load("ours") == [1, 0]  # and its own entry is loaded
