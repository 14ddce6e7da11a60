"""The paper's experiments, rerun: ``softmaxtheory reproduce <experiment>``.

:mod:`softmaxtheory.experiments.max_retrieval`
    The max-retrieval task of the paper: a single attention head trained on small
    sets, evaluated on sets up to 16384 items, with and without the adaptive
    temperature.
:mod:`softmaxtheory.experiments.clrs_text`
    The paper's CLRS-Text experiment at small scale: decoder-only transformers
    trained on algorithm traces with softmax and with the adaptive temperature,
    evaluated on larger problem sizes.
:mod:`softmaxtheory.experiments.minilm`
    The logit spread of every attention head of a real pretrained transformer
    (all-MiniLM-L6-v2), beside the bounds of :mod:`softmaxtheory.bounds`.

These modules need the ``experiments`` extra (torch, the packaged model, scipy,
matplotlib); importing this package imports none of them.
"""

__all__: list[str] = []
