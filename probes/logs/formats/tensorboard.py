"""TensorBoard event files (``events.out.tfevents.*``), read with the ``tensorboard`` package.

Written by ``torch.utils.tensorboard.SummaryWriter``, Lightning's ``TensorBoardLogger`` and the
HF Trainer's ``TensorBoardCallback``. Every scalar event (``add_scalar("train/loss", v, step)``)
is a record ``{tag: value, "step": step}``; records of the same step are merged. A folder is
read as one run: its event files (found recursively) in the order of their names, which start
with the writer's timestamp.

The reader is ``tensorboard``'s own event-file loader, an optional dependency
(``pip install 'gradient-doctor[tensorboard]'``): anyone whose code wrote event files through
PyTorch already has it, since ``SummaryWriter`` needs it. It is imported only here, only when an
event file is read.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import LogFormat, LogReadError, ReadStats, Sample
from gradient_doctor.probes.logs.records import map_record

EXTRA = "tensorboard"
MARKER = "tfevents"
#: Most event files read from one folder.
MAX_FILES = 10_000
#: TensorFlow dtype enum values of the scalar tensors the new-style summaries hold.
_DT_FLOAT, _DT_DOUBLE, _DT_HALF, _DT_INT32, _DT_INT64 = 1, 2, 19, 3, 9


def event_files(path: Path) -> list[Path]:
    """The event files of ``path`` (itself, or those under it), in name order."""
    if path.is_file():
        return [path]
    found: list[Path] = []
    for root, dirs, files in os.walk(path, onerror=lambda error: None):
        dirs.sort()
        found.extend(Path(root) / name for name in files if MARKER in name)
        if len(found) >= MAX_FILES:
            break
    return sorted(found[:MAX_FILES], key=lambda p: (p.name, str(p)))


def _loader(path: Path) -> Any:
    try:
        from tensorboard.backend.event_processing import event_file_loader
    except ImportError:
        raise LogReadError(
            f"{path} is a TensorBoard event file; reading it needs the tensorboard package: "
            f"pip install 'gradient-doctor[{EXTRA}]'"
        ) from None
    # The legacy loader hands events over as written (scalars as simple_value), without the
    # conversion to tensors that the newer loader does for every event.
    loader_class = getattr(event_file_loader, "LegacyEventFileLoader", None)
    if loader_class is None:
        loader_class = event_file_loader.EventFileLoader
    return loader_class(str(path))


def scalar(value: Any) -> float | None:
    """The number a summary value holds (old-style simple_value or a scalar tensor)."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    tensor = value.tensor
    if tensor.tensor_shape.dim and any(d.size != 1 for d in tensor.tensor_shape.dim):
        return None
    for repeated in (tensor.float_val, tensor.double_val, tensor.int_val, tensor.int64_val):
        if len(repeated) == 1:
            return float(repeated[0])
    content = tensor.tensor_content
    formats = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_HALF: "<e", _DT_INT32: "<i", _DT_INT64: "<q"}
    fmt = formats.get(tensor.dtype)
    if fmt is not None and len(content) == struct.calcsize(fmt):
        return float(struct.unpack(fmt, content)[0])
    return None


class TensorBoardEvents(LogFormat):
    id = "tensorboard"
    title = "TensorBoard event files"
    expects = "TensorBoard event files named events.out.tfevents.*"
    priority = 1
    folder = True

    def sniff(self, sample: Sample) -> float:
        return 1e9 if MARKER in sample.path.name else 0.0

    def records(self, path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
        files = event_files(path)
        if not files:
            raise LogReadError(f"{path}: no TensorBoard event files (events.out.tfevents.*)")
        for file in files:
            stats.files.append(str(file))
            stats.bytes += file.stat().st_size
            try:
                events = _loader(file).Load()
                for event in events:
                    stats.lines += 1
                    if not event.HasField("summary"):
                        continue
                    record: dict[str, Any] = {}
                    for value in event.summary.value:
                        number = scalar(value)
                        if number is not None:
                            record[value.tag] = number
                    if record:
                        record["step"] = int(event.step)
                        yield map_record(record)
            except LogReadError:
                raise
            except Exception as exc:  # a truncated or corrupt file: say which one
                raise LogReadError(
                    f"{file}: cannot read this TensorBoard event file ({type(exc).__name__}: {exc})"
                ) from None
