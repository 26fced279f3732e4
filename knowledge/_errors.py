"""Pasted errors and tracebacks: which are gradient failures, and which are not ours.

Private to ``knowledge.matcher``. People paste the exception their run died with, often with
nothing else. Its words mislead a word ranker: "No module named 'flash_attn'", "DataLoader
worker is killed by signal: Bus error", "shapes cannot be multiplied" share "module", "signal",
"multiplied" or "tensor" with gradient entries, and a CUDA out-of-memory error in an evaluation
loop shares "out of memory" with the memory rationalizations. :func:`read_errors` recognises the
exception type and message of common errors that are not gradient failures (imports and
installs, loader workers and shared memory, shapes, devices, dtypes, device-side asserts,
memory in evaluation, distributed plumbing) and each comes with a pointer to where the fix
lives. It also recognises the errors autograd, clipping and the loss scaler raise ("element 0
of tensors does not require grad", "modified by an inplace operation", "Function
'SqrtBackward0' returned nan values", "non-finite, so it cannot be clipped") so that a text
holding one of those stays in scope whatever else it pastes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gradient_doctor.knowledge import _regex


@dataclass(frozen=True)
class ErrorKind:
    """One family of errors: how its message reads and, when it is not ours, where to look."""

    name: str
    #: Lower-case words one of which every message holds (a cheap test before the regex).
    cues: tuple[str, ...]
    message: re.Pattern[str]
    #: Where the fix lives (out-of-scope kinds only).
    pointer: str = ""
    #: A gradient failure: the text stays in scope.
    gradient: bool = False
    #: Only with these words somewhere in the text or code (where the error happened).
    context: re.Pattern[str] | None = None
    #: Not when these words are there (the same message from a training step is ours).
    unless: re.Pattern[str] | None = None
    #: Words such a report uses in their own sense, not as a gradient question ("the other
    #: ranks hang" after a collective timeout).
    incidental: re.Pattern[str] | None = None


@dataclass(frozen=True)
class ErrorReading:
    """The errors a text pastes: the first non-gradient kind, and any gradient ones."""

    kind: ErrorKind
    gradient_kinds: tuple[ErrorKind, ...]
    #: The text without the error's own lines (traceback frames, the exception line).
    rest: str


_I = re.IGNORECASE
# Running out of memory, however the error or the user words it; shared by the error kinds
# that tell where it happened (evaluation, model loading).
_OUT_OF_MEMORY = _regex.compile(
    r"\bout\s+of\s+(?:(?:GPU|CUDA|device|video)\s+)?memory|OutOfMemoryError|\bOOMs?\b"
    r"|\bOOM(?:ed|s|ing)\b",
    _I,
)
_S = r"[\s\S]{0,80}?"

#: Autograd, clipping and loss-scaler errors: the question is about gradients.
_GRADIENT_KINDS = (
    ErrorKind(
        "graph-detached",
        ("grad_fn",),
        _regex.compile(r"does\s+not\s+require\s+grad\s+and\s+does\s+not\s+have\s+a\s+grad_fn", _I),
        gradient=True,
    ),
    ErrorKind(
        "inplace-modified",
        ("inplace",),
        _regex.compile(r"needed\s+for\s+gradient\s+computation\s+has\s+been\s+modified\s+by", _I),
        gradient=True,
    ),
    ErrorKind(
        "backward-twice",
        ("second time",),
        _regex.compile(r"backward\s+through\s+the\s+graph\s+a\s+second\s+time", _I),
        gradient=True,
    ),
    ErrorKind(
        "anomaly-nan",
        ("backward",),
        _regex.compile(
            r"Function\s+'?\w+Backward\w*'?\s+returned\s+nan|Error\s+detected\s+in\s+\w+Backward",
            _I,
        ),
        gradient=True,
    ),
    ErrorKind(
        "clip-nonfinite",
        ("non-finite", "nonfinite"),
        _regex.compile(r"non-finite,\s+so\s+it\s+cannot\s+be\s+clipped|error_if_nonfinite", _I),
        gradient=True,
    ),
    ErrorKind(
        "scaler",
        ("unscale", "implicitly created"),
        _regex.compile(
            r"unscale_\(\)\s+has\s+already\s+been\s+called|Attempting\s+to\s+unscale\s+FP16"
            r"|grad\s+can\s+be\s+implicitly\s+created\s+only\s+for\s+scalar",
            _I,
        ),
        gradient=True,
    ),
)

_EVALUATION = _regex.compile(
    r"\b(?:evaluat\w*|validat\w*|val(?:idation)?[\s_-]+(?:loop|step|pass|set|batch\w*)|"
    r"inference|predict\w*|test(?:ing)?[\s_-]+(?:loop|set|pass)|generat\w*|eval\s*\(\s*\)|"
    r"no_grad|inference_mode|model\.eval)\b",
    _I,
)
#: Building or loading the model, before the first batch: memory there holds only the weights.
_LOADING = _regex.compile(
    r"\b(?:load(?:ing)?|build(?:ing)?|instantiat\w*|construct\w*|creat(?:e|ing))\s+(?:the\s+|my\s+|"
    r"a\s+)?(?:pretrained\s+)?(?:model|weights|checkpoint|network)\b|\bfrom_pretrained\b"
    r"|\bmodel\.(?:to|cuda)\s*\(|\bbefore\s+(?:the\s+)?(?:first\s+)?(?:batch|step|forward|iteration)"
    r"|\bload_state_dict\b",
    _I,
)
#: A step that computes gradients: a memory error there is the memory questions' own.
_TRAINING_STEP = _regex.compile(
    r"\bbackward\b|\b(?:accumulat\w*|micro[\s-]?batch\w*)\b"
    r"|\b(?:need|want|use|get\s+to|reach|train\s+with)\b[^.\n]{0,40}\bbatch",
    _I,
)

#: Errors that are not gradient failures, each with where its fix lives.
_OTHER_KINDS = (
    ErrorKind(
        "install",
        (
            "module",
            "importerror",
            "shared object",
            "undefined symbol",
            "dll load",
            "driver",
            "kernel image",
            "compiled with cuda",
            "is_available",
            "cuda setup",
        ),
        _regex.compile(
            r"\bModuleNotFoundError\b|\bImportError\b|\bNo\s+module\s+named\b"
            r"|cannot\s+open\s+shared\s+object\s+file|\bundefined\s+symbol\b|DLL\s+load\s+failed"
            r"|CUDA\s+driver\s+version\s+is\s+insufficient|no\s+kernel\s+image\s+is\s+available"
            r"|Found\s+no\s+NVIDIA\s+driver|Torch\s+not\s+compiled\s+with\s+CUDA"
            # No GPU seen by torch, or a package's own CUDA set-up (bitsandbytes) failing.
            r"|\bcuda\.is_available\(\)\s*(?:returns?|returned|is|gives|gave|==|:|->)?\s*False\b"
            r"|\bCUDA\s+Setup\s+failed\b",
            _I,
        ),
        pointer=(
            "An import or installation error, not a gradient problem: the package or one of "
            "its compiled libraries is missing or was built for another torch/CUDA version. "
            "Compare `pip show torch`, `torch.version.cuda` and the package's supported "
            "versions, and reinstall matching wheels in the environment the script runs in."
        ),
    ),
    ErrorKind(
        "loader-workers",
        ("worker", "bus error", "shared memory", "shm", "pickle"),
        _regex.compile(
            rf"DataLoader\s+worker{_S}(?:killed\s+by\s+signal|exited\s+unexpectedly)"
            r"|\bbus\s+error\b|out\s+of\s+shared\s+memory|insufficient\s+shared\s+memory"
            r"|\bshm\b|/dev/shm|segmentation\s+fault\s+encountered\s+in\s+worker"
            r"|Can't\s+pickle\s+local\s+object",
            _I,
        ),
        pointer=(
            "A data-loader worker error, not a gradient problem: the worker processes ran out "
            "of shared memory (/dev/shm; small by default in Docker) or crashed. Give the "
            "container more shared memory (`--shm-size=8g` or `--ipc=host`), lower "
            "num_workers, or set torch.multiprocessing's sharing strategy to 'file_system'; "
            "num_workers=0 shows the underlying error in the main process."
        ),
    ),
    ErrorKind(
        # A saved state that does not fit the model built now: the message names a
        # checkpoint, weights and parameters in their file sense, never a gradient problem.
        "checkpoint",
        ("state_dict", "size mismatch", "current model"),
        _regex.compile(
            r"Error\(s\)\s+in\s+loading\s+state_dict"
            r"|\bsize\s+mismatch\s+for\s+[\w.]+:\s+copying\s+a\s+param\s+with\s+shape[\s\S]{0,240}?"
            r"current\s+model\s+is\s+torch\.Size\(\[[\d,\s]*\]\)\)?\.?"
            r"|\b(?:Missing|Unexpected)\s+key\(s\)\s+in\s+state_dict",
            _I,
        ),
        pointer=(
            "A checkpoint that does not fit the model, not a gradient problem: the saved "
            "tensors' shapes or names differ from the model built now (another number of "
            "classes, a resized vocabulary or embedding, a wrapper's prefix such as 'module.'). "
            "Build the model with the configuration used when saving (for an adapter, resize "
            "the base model's embeddings to the tokenizer it was trained with), or drop the "
            "mismatched head and load with strict=False, then train that head."
        ),
        incidental=_regex.compile(
            r"\b(?:checkpoint\w*|inference|weights?|params?|parameters?|embed\w*|heads?)\b", _I
        ),
    ),
    ErrorKind(
        "shape",
        (
            "equal size",
            "multiplied",
            "must match",
            "size mismatch",
            "batch_size",
            "channels",
            "input size",
            "invalid for input",
        ),
        _regex.compile(
            r"stack\s+expects\s+each\s+tensor\s+to\s+be\s+equal\s+size"
            r"|shapes\s+cannot\s+be\s+multiplied|size\s+of\s+tensor\s+a\s+\(\d+\)\s+must\s+match"
            r"|\bsize\s+mismatch\s+for\b|Expected\s+input\s+batch_size"
            r"|expected\s+input\[[^\]]*\]\s+to\s+have\s+\d+\s+channels"
            r"|Target\s+size\s+\([^)]*\)\s+must\s+be\s+the\s+same\s+as\s+input\s+size"
            r"|shape\s+'\[[^\]]*\]'\s+is\s+invalid\s+for\s+input\s+of\s+size"
            r"|Sizes\s+of\s+tensors\s+must\s+match",
            _I,
        ),
        pointer=(
            "A tensor shape mismatch, not a gradient problem: two tensors (a layer and its "
            "input, or the samples of one batch) disagree in size. Print the shapes on the "
            "failing line; after changing an input size, recompute the first linear layer's "
            "in_features; samples of different sizes need a resize or a custom collate_fn."
        ),
        # Layers named in a shape question ("Conv2D x3, Flatten, Dense(128)"): not a curve
        # that flattens.
        incidental=_regex.compile(r"\b(?:flatten\w*|dense|conv\w*|linear)\b", _I),
    ),
    ErrorKind(
        "device",
        ("device", "weight type"),
        _regex.compile(
            r"Expected\s+all\s+tensors\s+to\s+be\s+on\s+the\s+same\s+device"
            r"|found\s+at\s+least\s+two\s+devices"
            r"|Input\s+type\s+\([\w.]*cuda[\w.]*\)\s+and\s+weight\s+type\s+\((?![\w.]*cuda)"
            r"|Input\s+type\s+\((?![\w.]*cuda)[\w.]*\)\s+and\s+weight\s+type\s+\([\w.]*cuda",
            _I,
        ),
        pointer=(
            "A device mismatch, not a gradient problem: one tensor is on the CPU and another "
            "on the GPU. Move the model once (`model.to(device)`) and every batch, target and "
            "tensor created in forward (use `device=x.device`) to the same device; buffers "
            "belong in `register_buffer` so they move with the model."
        ),
    ),
    ErrorKind(
        "dtype",
        ("scalar type", "dtype", "not implemented for", "be cast", "weight type"),
        _regex.compile(
            r"expected\s+scalar\s+type\s+\w+\s+but\s+found\s+\w+"
            r"|Found\s+dtype\s+\w+\s+but\s+expected\s+\w+|must\s+have\s+the\s+same\s+dtype"
            r"|not\s+implemented\s+for\s+'(?:Half|BFloat16|Long|Int|Bool)'"
            r"|result\s+type\s+\w+\s+can't\s+be\s+cast"
            r"|Input\s+type\s+\([\w.]*(?:Half|Float|Double|BFloat16)Tensor\)\s+and\s+weight\s+type",
            _I,
        ),
        pointer=(
            "A dtype mismatch, not a gradient problem: an operation got tensors of different "
            "types (class targets must be int64/long for cross-entropy, float for BCE; inputs "
            "must match the weights' dtype outside autocast). Cast on the failing line "
            "(`.long()`, `.float()`) or run that part under the same autocast context."
        ),
    ),
    ErrorKind(
        "index",
        ("assert", "index out of range", "out of bounds", "indexselect"),
        _regex.compile(
            r"device-side\s+assert\s+triggered|index\s+out\s+of\s+range\s+in\s+self"
            r"|t\s*>=\s*0\s*&&\s*t\s*<\s*n_classes|Target\s+-?\d+\s+is\s+out\s+of\s+bounds"
            r"|indexSelect\w*\s*:\s*block",
            _I,
        ),
        pointer=(
            "An index out of range (a label >= the number of classes, a token id >= the "
            "embedding size, or a negative label), not a gradient problem. Rerun on the CPU or "
            "with CUDA_LAUNCH_BLOCKING=1 to see the failing line, then check "
            "`labels.min()`, `labels.max()` against the number of classes and the vocabulary "
            "size against the embedding."
        ),
    ),
    ErrorKind(
        "eval-memory",
        ("memory", "oom"),
        _OUT_OF_MEMORY,
        pointer=(
            "Memory during evaluation, not a gradient problem: nothing there needs gradients. "
            "Run it under `torch.no_grad()` / `torch.inference_mode()` with `model.eval()`, "
            "move what you keep to the CPU (`.cpu()`, `.item()`) instead of collecting GPU "
            "tensors across batches, and lower the evaluation batch size or call "
            "`torch.cuda.empty_cache()` after the training step if memory is tight."
        ),
        context=_EVALUATION,
        unless=_TRAINING_STEP,
    ),
    ErrorKind(
        "load-memory",
        ("memory", "oom"),
        _OUT_OF_MEMORY,
        pointer=(
            "Memory while the model is built or loaded, before any training step, not a "
            "gradient problem: the weights alone do not fit (4 bytes per parameter in fp32, "
            "2 in bf16/fp16). Load them in half precision, onto the CPU first or sharded "
            "across devices (a device map, FSDP or ZeRO), or pick a card or model that fits; "
            "gradient accumulation and checkpointing only save memory inside a step."
        ),
        context=_LOADING,
        unless=_TRAINING_STEP,
    ),
    ErrorKind(
        "distributed",
        ("watchdog", "nccl", "address already", "childfailed"),
        _regex.compile(
            r"Watchdog\s+caught\s+collective\s+operation\s+timeout|NCCL\s+(?:error|timeout)"
            r"|ncclSystemError|ncclInternalError|Address\s+already\s+in\s+use"
            r"|ChildFailedError",
            _I,
        ),
        pointer=(
            "A distributed-launch error, not a gradient problem: a rank crashed, hung or could "
            "not reach the others. Run with NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL, "
            "read the first rank that failed, check that every rank runs the same number of "
            "collective calls, and pick a free MASTER_PORT."
        ),
        incidental=_regex.compile(r"\b(?:ranks?|ddp|nodes?|gpus?|hang\w*|stuck)\b", _I),
    ),
)

#: Traceback furniture: the header, stack frames and the source line under each frame.
_FRAME = _regex.compile(
    r"^\s*Traceback \(most recent call last\):.*$|^\s*File \"[^\"\n]*\", line \d+.*(?:\n\s+\S.*)?$"
    r"|^\s*\.\.\.\s*$",
    re.MULTILINE,
)


#: Before the error on its line: the line is the exception or a log record of it
#: ("RuntimeError: ...", "ERROR: ...", "[rank3]:[E ProcessGroupNCCL.cpp:616] ...").
_EXCEPTION_LINE = _regex.compile(
    r"^\s*\S*$|[\w.]*(?:Error|Exception|Warning)\b|\bERROR\b|\[E\s|\w\.(?:cpp|cu|cuh|h|py):\d+",
    re.MULTILINE,
)
#: Where a clause of prose ends (a period before a space, not the one in "torch.cuda").
_CLAUSE_END = _regex.compile(r"[,.!?;](?=\s)|\n")
#: Words that name no-gradient evaluation, not a gradient question ("under torch.no_grad").
_NO_GRAD_WORDS = _regex.compile(r"\b(?:torch\.)?(?:no_grad|inference_mode|enable_grad)\b(?:\(\))?")


def _without_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the error each span holds: its whole line when the line is the
    exception, else its quote or the clause of prose that names it."""
    if not spans:
        return text
    cuts: list[tuple[int, int]] = []
    for start, end in spans:
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        opening = text.rfind('"', 0, start)
        closing = text.find('"', end)
        if (
            opening >= 0
            and closing >= 0
            and closing - opening < 600
            and text.count('"', 0, opening) % 2 == 0
        ):
            # Quoted in a sentence ('got past "ModuleNotFoundError: ..." by ...'): the quote.
            cuts.append((opening, closing + 1))
            continue
        if _EXCEPTION_LINE.search(text, line_start, start):
            cuts.append((line_start, line_end))
            continue
        before = [m.end() for m in _CLAUSE_END.finditer(text, line_start, start)]
        after = _CLAUSE_END.search(text, end)
        cuts.append((before[-1] if before else line_start, after.end() if after else len(text)))
    keep: list[str] = []
    cursor = 0
    for start, end in sorted(cuts):
        if start > cursor:
            keep.append(text[cursor:start])
        cursor = max(cursor, end)
    keep.append(text[cursor:])
    return " ".join(keep)


def read_errors(text: str, code: str = "") -> ErrorReading | None:
    """The errors ``text`` pastes or names, or ``None`` when it holds no non-gradient one."""
    lowered = text.lower()
    spans: list[tuple[int, int]] = []
    found: ErrorKind | None = None
    where = text + "\n" + code if code else text
    for kind in _OTHER_KINDS:
        if not any(cue in lowered for cue in kind.cues):
            continue
        hit = kind.message.search(text)
        if hit is None:
            continue
        if kind.context is not None and not kind.context.search(where):
            continue
        if kind.unless is not None and kind.unless.search(where):
            continue
        found = found or kind
        spans.extend(m.span() for m in kind.message.finditer(text))
    if found is None:
        return None
    gradient = tuple(
        kind
        for kind in _GRADIENT_KINDS
        if any(cue in lowered for cue in kind.cues) and kind.message.search(text)
    )
    for kind in gradient:
        spans.extend(m.span() for m in kind.message.finditer(text))
    rest = _NO_GRAD_WORDS.sub(" ", _FRAME.sub(" ", _without_spans(text, spans)))
    if found.incidental is not None:
        rest = found.incidental.sub(" ", rest)
    return ErrorReading(found, gradient, rest)
