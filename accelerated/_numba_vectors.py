r"""The kernels' vector width: AVX-512 registers where the processor has them (private).

LLVM's x86 back end vectorises for 256-bit registers on processors that have 512-bit
ones (its tuning for Skylake-SP and later Intel cores prefers them, for the clock
speed that 512-bit instructions once cost), and Numba compiles for the host with
LLVM's tuning. torch's CPU kernels run on AVX-512 where it is present, so on such a
machine softmaxtheory's kernels did half the work per instruction of the
``torch.softmax`` they are measured against. On an Intel Xeon with AVX-512 (2 cores),
over the 32 cases of ``cpu.softmax`` and ``cpu.adaptive_softmax`` in ``softmaxtheory
bench``, the time with LLVM's choice over the time with 512-bit vectors ranged from 0.99
to 1.37, median 1.23 (the performance page's "Vector width"; ``tools/vector_width.py``
times both builds).

:data:`PIPELINE` is the compiler that :func:`softmaxtheory.accelerated._numba_cache.njit`
gives every kernel: Numba's own nopython pipeline with one pass before lowering,
which marks each function the kernel lowers (with the bodies of its parallel loops,
lowered through the same target context) with LLVM's ``"prefer-vector-width"="512"``
attribute. It is a preference, as clang's ``-mprefer-vector-width=512``: a processor
without 512-bit registers compiles exactly as before, and nothing outside the kernels
(a user's own Numba functions) is touched. Which instructions run changes no result
beyond what the kernels' error bounds already allow for (the order of a vectorised
sum), and a given machine computes the same bits in every process.
"""

from __future__ import annotations

import copy
from typing import Any

from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import LoweringPass, PassManager, register_pass
from numba.core.typed_passes import AnnotateTypes

__all__ = ["ATTRIBUTE", "PIPELINE", "PIPELINE_KEY", "WideVectorsCompiler", "wide_context"]

#: The LLVM function attribute each kernel function is compiled with.
ATTRIBUTE = '"prefer-vector-width"="512"'

#: What the kernels' cache index keys add to Numba's, so that machine code compiled
#: without the pipeline (or with another attribute) is never loaded for them.
PIPELINE_KEY = ("softmaxtheory.accelerated._numba_vectors", ATTRIBUTE)


def _mark(module: Any) -> None:
    """Give every function defined in the llvmlite.ir `module` :data:`ATTRIBUTE`."""
    for fn in module.functions:
        if not fn.is_declaration:
            # llvmlite's attribute set names the enum attributes it knows; a string
            # attribute is written into the IR text as it is
            set.add(fn.attributes, ATTRIBUTE)


def wide_context(ctx: Any) -> Any:
    """A copy of the Numba target context `ctx` whose lowered modules carry :data:`ATTRIBUTE`.

    The copy is the one Numba makes for each compilation (``subtarget``, a shallow
    copy), with its ``post_lowering`` hook (which Numba calls on each lowered module,
    before handing it to LLVM) marking the module's functions first. The bodies of
    ``prange`` loops are compiled with the context of the function that holds them, so
    they carry it too.
    """
    if getattr(ctx, "_softmaxtheory_wide", False):
        return ctx
    wide = copy.copy(ctx)
    post_lowering = ctx.post_lowering

    def marked(module: Any, library: Any) -> None:
        _mark(module)
        post_lowering(module, library)

    wide.post_lowering = marked
    wide._softmaxtheory_wide = True
    return wide


@register_pass(mutates_CFG=False, analysis_only=False)
class WideVectors(LoweringPass):
    """Compile the rest of the pipeline with :func:`wide_context`."""

    _name = "softmaxtheory_wide_vectors"

    def __init__(self) -> None:
        LoweringPass.__init__(self)

    def run_pass(self, state: Any) -> bool:
        state.targetctx = wide_context(state.targetctx)
        return False


class WideVectorsCompiler(CompilerBase):
    """Numba's own nopython pipeline, with :class:`WideVectors` right before lowering.

    The pipeline is Numba's (``DefaultPassBuilder.define_nopython_pipeline``, with the
    parallel passes where ``parallel=True``), so it follows Numba's releases; the pass
    goes after ``AnnotateTypes``, the last pass before the lowering one.
    """

    def define_pipelines(self) -> list[PassManager]:
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state, "softmaxtheory_nopython")
        pm.add_pass_after(WideVectors, AnnotateTypes)
        pm.finalize()
        return [pm]


#: The compiler class the kernels are jitted with (``numba.njit(pipeline_class=...)``).
PIPELINE = WideVectorsCompiler
