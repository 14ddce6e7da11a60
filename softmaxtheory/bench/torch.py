"""GPU benchmark of adaptive attention: ``softmaxtheory bench --device cuda``.

Times :func:`softmaxtheory.accelerated.torch.adaptive_attention` (``auto``: the
hybrid of a Triton pass 1 and SDPA on β-scaled queries; the T10 composition;
the all-Triton kernel) and :func:`~softmaxtheory.accelerated.torch.attention_entropy`
against :func:`torch.nn.functional.scaled_dot_product_attention` at the same
shape, causal and not, forward and forward + backward (β attached, and
``detach_beta=True``); then, at the first shape of each pass, with a boolean
key-padding mask (:func:`key_padding_mask`, SDPA given the same mask). First the
device is kept busy for a second (:func:`warm_device`: clocks). Each case:
one warm-up call (compiles the kernels), one call for the peak memory
(``torch.cuda.max_memory_allocated`` growth), then `repeat` timed calls (CUDA
events); the median is ``seconds`` and the best ``best_seconds``. ``host_seconds``
is the median host time until a call returns (queueing its kernels, and any wait
for a value read back): where it exceeds the device time, the GPU idles. For the
adaptive path (``auto``, and ``auto_fwd_bwd``) one profiled call gives
``breakdown``, its kernels by device time. With ``--tiles``,
:mod:`softmaxtheory.bench.tiles` times every launch configuration of the pass-1
kernels (``tiles``) after the unmasked cases and before the masked ones.
``--quick`` runs every case at one small shape (``QUICK_SHAPES``), a smoke run of
the whole benchmark in seconds. A case that fails is recorded with its error and
the run goes on.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from . import save_json

__all__ = [
    "BACKWARD_SHAPES",
    "MASK_KIND",
    "QUICK_SHAPES",
    "SHAPES",
    "WARMUP_SECONDS",
    "breakdown",
    "format_run",
    "key_padding_mask",
    "measure",
    "plan_cases",
    "run_device",
    "self_time_rows",
    "warm_device",
]

#: (B, H, L, S, D) cases, bfloat16 (D = 128 at 8192 included).
SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
    (8, 16, 4096, 4096, 64),
    (4, 16, 8192, 8192, 128),
    (2, 16, 16384, 16384, 64),
)

#: The shapes at which forward + backward is timed, the issue's (4, 16, 4096, 4096, 64)
#: first, then the two larger forward shapes.
BACKWARD_SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
    (4, 16, 4096, 4096, 64),
    (4, 16, 8192, 8192, 128),
    (2, 16, 16384, 16384, 64),
)

#: ``--quick``: every case, forward and forward + backward, at one small shape.
QUICK_SHAPES: tuple[tuple[int, int, int, int, int], ...] = ((1, 2, 256, 256, 64),)

#: The mask of the masked cases, as their rows name it (``mask``).
MASK_KIND = "boolean key padding, (B, 1, 1, S)"

#: Default number of timed calls per case on a device (``--quick``: 5).
DEFAULT_REPEAT = 50

#: Timed calls per configuration of the tile sweep.
TILE_REPEAT = 10


def _time(fn: Any, repeat: int, torch: Any) -> tuple[float, int, float, float]:
    """Device time (median, s), peak memory (bytes), best device time (s), host time (s).

    Median and best of the device time over `repeat` calls (CUDA events), the
    peak memory of one call, and the median host time until the call returns.
    The host time is what the call costs the CPU to queue its kernels (with any wait for
    the device inside it, such as a value read back); while it exceeds the device time of
    what was queued before, the GPU idles.
    """
    fn()  # warm-up (compiles the Triton kernels)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    times, host = [], []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), peak, min(times), statistics.median(host)


def breakdown(fn: Any, torch: Any, device_type: str = "cuda", top: int = 12) -> dict:
    """Where one call's time goes: its ops or kernels, by self time, from ``torch.profiler``.

    On CUDA the entries are the kernels (and copies) that ran on the device, with their
    device time; elsewhere the ops, with their host time. Returns ``total_us`` (all
    entries), ``entries`` (the `top` largest as ``[name, microseconds, count]``) and
    ``other_us`` (the rest). The call is made once, after the caller's warm-up.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device_type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    rows = self_time_rows(prof.key_averages(), cuda)
    total = sum(r[1] for r in rows)
    kept = rows[:top]
    return {"total_us": total, "entries": kept, "other_us": total - sum(r[1] for r in kept)}


def self_time_rows(averages: Any, device: bool) -> list[list[Any]]:
    """``[name, microseconds, count]`` of each profiled event with self time, largest first.

    With `device`, the device's own events (kernels, copies) by device time: a host op
    that launched a kernel carries that kernel's time as its own device time too, so
    counting the host ops as well listed an SDPA call's kernel twice (once under the
    ``aten::`` name) while a Triton launch, under no op, counted once.
    """
    from torch.autograd import DeviceType

    attr = "self_device_time_total" if device else "self_cpu_time_total"
    rows = [
        [e.key, float(getattr(e, attr)), int(e.count)] for e in averages
        if getattr(e, attr) > 0 and (not device or e.device_type != DeviceType.CPU)
    ]  # fmt: skip
    return sorted(rows, key=lambda r: -r[1])


def key_padding_mask(torch: Any, B: int, S: int, device: Any) -> Any:
    r"""The masked cases' boolean mask, of shape (B, 1, 1, S): True where a key is attended.

    Sequence ``b`` of the batch keeps its first :math:`S - (b \bmod 4 + 1)\lfloor S/8
    \rfloor` keys (7/8 of them, 6/8, 5/8, 4/8, again from the fifth): padded batches of
    unequal lengths, every query row of a sequence with the same keys, as in an encoder.
    """
    kept = S - (torch.arange(B, device=device) % 4 + 1) * (S // 8)
    return (torch.arange(S, device=device) < kept[:, None]).view(B, 1, 1, S)


def _forward_cases(
    torch: Any, q: Any, k: Any, v: Any, causal: bool, have_triton: bool, mask: Any = None
) -> dict:
    from softmaxtheory.accelerated.torch import adaptive_attention, attention_entropy

    F = torch.nn.functional
    opts = {"attn_mask": mask, "is_causal": causal}
    cases = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, **opts),
        "auto": lambda: adaptive_attention(q, k, v, **opts),
        "composition": lambda: adaptive_attention(q, k, v, **opts, backend="composition"),
        "attention_entropy": lambda: attention_entropy(q, k, **opts),
    }
    if have_triton:
        cases["triton"] = lambda: adaptive_attention(q, k, v, **opts, backend="triton")
    return cases


def _backward_cases(torch: Any, q: Any, k: Any, v: Any, causal: bool, mask: Any = None) -> dict:
    from softmaxtheory.accelerated.torch import adaptive_attention

    F = torch.nn.functional
    opts = {"attn_mask": mask, "is_causal": causal}
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    grad = torch.ones_like(q[..., : v.shape[-1]])

    def step(fn: Any) -> Any:
        def run() -> None:
            try:
                torch.autograd.backward(fn(), grad)
            finally:  # also after a failure: the next case starts with no gradients held
                for t in (qg, kg, vg):
                    t.grad = None

        return run

    return {
        "sdpa_fwd_bwd": step(lambda: F.scaled_dot_product_attention(qg, kg, vg, **opts)),
        "auto_fwd_bwd": step(lambda: adaptive_attention(qg, kg, vg, **opts)),
        "auto_fwd_bwd_detached": step(
            lambda: adaptive_attention(qg, kg, vg, **opts, detach_beta=True)
        ),
    }


def plan_cases(
    shapes: tuple[tuple[int, int, int, int, int], ...],
    backward_shapes: tuple[tuple[int, int, int, int, int], ...] = BACKWARD_SHAPES,
) -> list[tuple]:
    """The order of the cases: most wanted first, so a run stopped early has them.

    Each shape forward, without and with the causal mask; forward + backward at the
    first of `backward_shapes` right after the first shape, at the others after every
    forward case; last, the first shape of each pass with :func:`key_padding_mask` (not
    causal). Items are ``(shape, causal)``, ``(shape, causal, "backward")``,
    ``(shape, False, "masked")`` or ``(shape, False, "masked backward")``.
    """
    back = [[(b, c, "backward") for c in (False, True)] for b in backward_shapes]
    plan: list[tuple] = []
    for i, shape in enumerate(shapes):
        plan += [(shape, False), (shape, True)]
        if i == 0 and back:
            plan += back[0]
    rest = back[1:] if shapes else back
    plan += [case for cases in rest for case in cases]
    plan += [(shape, False, "masked") for shape in shapes[:1]]
    return plan + [(shape, False, "masked backward") for shape in backward_shapes[:1]]


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # not installed, or no metadata
        return None


def _utc_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_device(args: Any) -> int:
    """Run the GPU benchmark for ``args.device``; print a table (or JSON with ``args.json``)."""
    device = str(getattr(args, "device", "cuda"))
    quick = bool(getattr(args, "quick", False))
    repeat = int(getattr(args, "repeat", None) or (5 if quick else DEFAULT_REPEAT))
    if repeat < 1:
        print(f"softmaxtheory bench: error: --repeat must be >= 1, got {repeat}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("softmaxtheory bench: error: the GPU benchmark needs torch (pip install "
              "softmaxtheory[torch])",
              file=sys.stderr)  # fmt: skip
        return 2
    if not device.startswith("cuda") or not torch.cuda.is_available():
        msg = f"softmaxtheory bench: error: --device {device}: no CUDA device is available here"
        print(f"{msg} (torch {torch.__version__}, cuda {torch.version.cuda})", file=sys.stderr)
        return 2
    shapes = getattr(args, "shapes", None) or (QUICK_SHAPES if quick else SHAPES)
    backward = getattr(args, "backward_shapes", None) or (
        QUICK_SHAPES if quick else BACKWARD_SHAPES
    )
    doc = measure(
        torch, device, shapes, backward, repeat,
        tiles=bool(getattr(args, "tiles", False)), output=getattr(args, "output", None),
    )  # fmt: skip
    if getattr(args, "json", False):
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(format_run(doc)))
    return 0


def _have_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def measure(
    torch: Any,
    device: str,
    shapes: tuple[tuple[int, int, int, int, int], ...],
    backward_shapes: tuple[tuple[int, int, int, int, int], ...],
    repeat: int,
    *,
    tiles: bool = False,
    output: str | None = None,
) -> dict[str, Any]:
    """Time every case of :func:`plan_cases` on `device`; return the run's document.

    Parameters
    ----------
    torch : module
        The torch module (timing uses ``torch.cuda``'s events and memory counters).
    device : str
        Where the bfloat16 inputs are made (``"cuda"``, ``"cuda:1"``).
    shapes, backward_shapes : tuple of tuple of int
        The forward cases' shapes and the forward + backward cases' shapes, each
        (B, H, L, S, D).
    repeat : int
        Timed calls per case, after one warm-up call and one call for the peak memory.
    tiles : bool, optional
        Run the tile sweep at ``shapes[0]`` and ``backward_shapes[0]`` after the
        unmasked cases, before the masked ones.
    output : str, optional
        A path the document is written to after every row (``complete`` false until
        the end), so that a run stopped early keeps what it measured.

    Returns
    -------
    dict
        The machine (``device``, ``torch``, ``triton``, ``cuda``), ``date``,
        ``repeat``, ``statistic``, ``complete``, ``rows`` (forward),
        ``backward_rows``, ``masked_rows`` (both passes, with :func:`key_padding_mask`)
        and, with `tiles`, ``tiles``. Each row holds its ``shape``, ``dtype``,
        ``causal`` and ``pass`` (a masked row also its ``mask``,
        :data:`MASK_KIND`) and, per case, either
        ``seconds``, ``peak_bytes``, ``best_seconds`` and ``host_seconds`` or an
        ``error``; a row whose inputs could not be made holds only an ``error``.
    """
    have_triton = _have_triton()
    rows: list[dict[str, Any]] = []
    sweep: dict[str, Any] = {}
    warmed = warm_device(torch, device)

    def document(complete: bool) -> dict[str, Any]:
        return {
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": _version("triton"), "cuda": torch.version.cuda,
            "softmaxtheory": _version("softmaxtheory"), "repeat": repeat,
            "statistic": "median", "date": _utc_now(), "complete": complete,
            "warmup_seconds": warmed,
            "rows": [r for r in rows if r["pass"] == "forward" and "mask" not in r],
            "backward_rows": [r for r in rows if r["pass"] != "forward" and "mask" not in r],
            "masked_rows": [r for r in rows if "mask" in r],
            **({"tiles": sweep} if sweep else {}),
        }  # fmt: skip

    def run(item: tuple) -> None:
        (B, H, L, S, D), causal = item[0], item[1]
        kind = item[2] if len(item) == 3 else "forward"
        res: dict[str, Any] = {
            "shape": [B, H, L, S, D], "dtype": "bfloat16", "causal": causal,
            "pass": "forward+backward" if kind.endswith("backward") else "forward",
            **({"mask": MASK_KIND} if kind.startswith("masked") else {}),
        }  # fmt: skip
        try:
            _measure_row(torch, device, res, repeat, have_triton)
        except torch.cuda.OutOfMemoryError as exc:
            res["error"] = f"out of memory: {exc}"
        except Exception as exc:  # one row failing must not cost the rest of a device run
            res["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(res)
        torch.cuda.empty_cache()
        if output:  # what is measured so far survives a run stopped at a time limit
            save_json(document(False), output)

    plan = plan_cases(shapes, backward_shapes)
    masked = [item for item in plan if item[2:] and item[2].startswith("masked")]
    for item in plan:
        if item not in masked:
            run(item)
    if tiles:  # before the masked cases: the sweep is for tuning what the targets read
        shape = (shapes or backward_shapes)[0]
        _tile_sweep(torch, device, have_triton, sweep, shape, backward_shapes[0],
                    lambda: output and save_json(document(False), output))  # fmt: skip
    for item in masked:
        run(item)
    doc = document(True)
    if output:
        save_json(doc, output)
    return doc


#: Seconds of dense bfloat16 products run on a CUDA device before the first timed case.
WARMUP_SECONDS = 1.0


def warm_device(torch: Any, device: str, seconds: float = WARMUP_SECONDS) -> float:
    """Keep a CUDA device busy for about `seconds` before timing; return the seconds spent.

    The first case of a run is SDPA's, right after the process started: a GPU still
    raising its clocks would make it look slower, and every ratio of its row better.
    Products of two 4096 x 4096 bfloat16 matrices, queued in groups of 8, until
    `seconds` have passed. Nothing (0.0) on another device.
    """
    if torch.device(device).type != "cuda":
        return 0.0
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            a = torch.mm(a, a).clamp_(-1.0, 1.0)
        torch.cuda.synchronize()
    del a
    torch.cuda.empty_cache()
    return round(time.perf_counter() - start, 3)


def _measure_row(torch: Any, device: str, res: dict, repeat: int, have_triton: bool) -> None:
    """Fill `res` with the times of its cases (each case's failure kept as its ``error``)."""
    B, H, L, S, D = res["shape"]
    causal, is_backward = res["causal"], res["pass"] != "forward"
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(B, H, n, D, device=device, dtype=torch.bfloat16, generator=g) for n in (L, S, S)
    )
    mask = key_padding_mask(torch, B, S, device) if "mask" in res else None
    if is_backward:
        cases = _backward_cases(torch, q, k, v, causal, mask)
        ctx = torch.enable_grad()
    else:
        cases = _forward_cases(torch, q, k, v, causal, have_triton, mask)
        ctx = torch.no_grad()
    with ctx:
        for name, fn in cases.items():
            print(f"timing {name} at {(B, H, L, S, D)} {_masking(res)} ...", file=sys.stderr)
            try:
                res[name] = dict(
                    zip(("seconds", "peak_bytes", "best_seconds", "host_seconds"),
                        _time(fn, repeat, torch), strict=True)
                )  # fmt: skip
            except torch.cuda.OutOfMemoryError as exc:
                res[name] = {"error": f"out of memory: {exc}"}
                torch.cuda.empty_cache()
            except Exception as exc:  # e.g. a kernel the device refuses: the others go on
                res[name] = {"error": f"{type(exc).__name__}: {exc}"}
        # the kernels of one call of the adaptive path, for tuning from one run
        name = "auto_fwd_bwd" if is_backward else "auto"
        if "seconds" in res[name]:
            try:
                kind = torch.device(device).type
                res["breakdown"] = {name: breakdown(cases[name], torch, device_type=kind)}
            except Exception as exc:  # a profiler that cannot run here: note it, go on
                res["breakdown"] = {name: {"error": f"{type(exc).__name__}: {exc}"}}


def _masking(res: dict[str, Any]) -> str:
    """A row's masking in one word: ``padding`` (:func:`key_padding_mask`), ``causal``, ``none``."""
    return "padding" if "mask" in res else "causal" if res["causal"] else "none"


def format_run(doc: dict[str, Any]) -> list[str]:
    """The lines of the text report of a run (:func:`measure`'s document).

    Per row (its masking: ``none``, ``causal``, or ``padding`` for the masked rows) and
    case: device time (ms), the ratio to SDPA's time in the same row
    (forward to ``sdpa``, forward + backward to ``sdpa_fwd_bwd``), peak memory (MiB)
    and host time (ms); a case that failed shows its error. Then the kernels of the
    profiled call and, with a sweep, its summary.
    """
    lines = [
        f"device: {doc['device']}, torch {doc['torch']}, Triton {doc['triton']}, "
        f"CUDA {doc['cuda']}, bfloat16, {doc['statistic']} of {doc['repeat']}",
        f"{'B,H,L,S,D':<24} {'masking':<7} {'case':<22} {'ms':>9} {'x SDPA':>8} "
        f"{'peak MiB':>10} {'host ms':>8}",
    ]
    for res in doc["rows"] + doc["backward_rows"] + doc.get("masked_rows", []):
        shape = ",".join(map(str, res["shape"]))
        if "error" in res:
            lines.append(f"{shape:<24} {_masking(res):<7} {res['error']}")
            continue
        base = res["sdpa_fwd_bwd" if res["pass"] != "forward" else "sdpa"].get("seconds")
        for name, r in res.items():
            if not isinstance(r, dict) or name == "breakdown":
                continue
            head = f"{shape:<24} {_masking(res):<7} {name:<22}"
            if "error" in r:
                lines.append(f"{head} {r['error']}")
                continue
            ratio = f"{r['seconds'] / base:>8.2f}" if base else f"{'-':>8}"
            lines.append(
                f"{head} {r['seconds'] * 1e3:>9.3f} {ratio} {r['peak_bytes'] / 2**20:>10.1f} "
                f"{r['host_seconds'] * 1e3:>8.3f}"
            )
        for name, b in res.get("breakdown", {}).items():
            if "entries" in b:
                top = ", ".join(f"{n[:40]} {us:.0f} us" for n, us, _ in b["entries"][:4])
                lines.append(f"{'':<24} {name} kernels: {b['total_us']:.0f} us in all; {top}")
            else:
                lines.append(f"{'':<24} {name} kernels: {b.get('error')}")
    sweep = doc.get("tiles")
    if sweep:
        from .tiles import summarize

        lines.append(f"tile sweep (median of {sweep.get('repeat', TILE_REPEAT)}):")
        body = [f"  {line}" for line in summarize(sweep.get("rows", []))]
        lines += body or [f"  {sweep.get('error')}"]
    return lines


def _tile_sweep(
    torch: Any,
    device: str,
    have_triton: bool,
    tiles: dict,
    shape: tuple[int, int, int, int, int],
    backward_shape: tuple[int, int, int, int, int],
    save: Any,
) -> None:
    """Fill `tiles` with the sweep's ``rows`` (or an ``error``), calling `save` as it goes."""
    if not have_triton:
        tiles["error"] = "Triton is not installed"
        return
    from .tiles import KERNELS, candidates, launchers, sweep

    print("tile sweep: every launch configuration of the pass-1 kernels ...", file=sys.stderr)
    try:
        cands = {k: candidates(k, shape[-1], torch.bfloat16) for k in KERNELS}
        runs = launchers(torch, device, shape, backward_shape)

        def progress(rows: list[dict]) -> None:
            tiles["rows"] = list(rows)
            save()

        tiles["repeat"] = TILE_REPEAT
        sweep(lambda fn: _time(fn, TILE_REPEAT, torch)[0], runs, cands, progress)
    except Exception as exc:  # the sweep is the last step: note a failure, keep the rest
        tiles["error"] = f"{type(exc).__name__}: {exc}"
    save()
