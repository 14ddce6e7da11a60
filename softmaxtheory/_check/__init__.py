"""The checking kit's internals (private; their names may change without notice).

The public faces are :mod:`softmaxtheory.testing`, :mod:`softmaxtheory.strategies`,
:mod:`softmaxtheory.conformance` and :mod:`softmaxtheory.pytest_plugin`. The modules
here hold what they share, under public names inside a private package (as
Hypothesis keeps its ``internal/``):

* ``error_model``: the a-priori error bounds of :mod:`softmaxtheory.testing`, derived
  in the documentation page *The error model*;
* ``report``: the formatting of failures and report lines (numbers in ulps,
  array literals for repro snippets, hints);
* ``target``: the kernel under test (:class:`~softmaxtheory.conformance.Target`),
  kernel loading and the validation of a run's options;
* ``runner``: one property's run: the bookkeeping, its notes, its verdict and
  the Hypothesis settings;
* ``properties``: the conformance suite's properties and ``PROPERTIES``.
"""

__all__: list[str] = []
