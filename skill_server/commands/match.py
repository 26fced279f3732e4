"""``gradient-doctor match``: which guidance fits a described symptom, claim or log line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gradient_doctor.skill_server.cli import EXIT_OK, UsageError

NAME = "match"
HELP = (
    "Match free text (a symptom, a tempting claim, a log line, pasted code) to the catalogue "
    "entries that fit, best first."
)

MAX_TOP = 50
#: Largest --code file read (bytes): a training loop, not a dataset.
MAX_CODE_BYTES = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gradient-doctor match``."""
    parser.add_argument(
        "text",
        metavar="TEXT",
        nargs="+",
        help="what happened or what is claimed (several words are joined; '-' reads stdin)",
    )
    parser.add_argument(
        "--code",
        metavar="FILE",
        help="a file with the training-loop code to match too ('-' reads stdin)",
    )
    parser.add_argument(
        "--top",
        metavar="K",
        type=int,
        default=5,
        help=f"how many matches to show (1–{MAX_TOP}, default 5)",
    )
    parser.add_argument(
        "--format",
        choices=("markdown", "json"),
        default="markdown",
        help="output format (default: markdown)",
    )


def _read_code(spec: str) -> str:
    if spec == "-":
        data = sys.stdin.buffer.read(MAX_CODE_BYTES + 1)
        label = "stdin"
    else:
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f"--code: no such file: {spec}")
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_CODE_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"--code: cannot read {spec}: {exc.strerror or exc}") from None
        label = spec
    if len(data) > MAX_CODE_BYTES:
        raise UsageError(f"--code: {label} is larger than {MAX_CODE_BYTES // 1000} kB")
    if b"\0" in data:
        raise UsageError(f"--code: {label} is a binary file, not source code")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--code: {label} is not UTF-8 text") from None


def _read_text(words: list[str]) -> str:
    if words == ["-"]:
        return sys.stdin.read(MAX_CODE_BYTES)
    return " ".join(words)


def run(args: argparse.Namespace) -> int:
    """Print the ranked matches for ``args.text``."""
    if args.text == ["-"] and args.code == "-":
        raise UsageError("TEXT and --code cannot both read stdin")
    if not 1 <= args.top <= MAX_TOP:
        raise UsageError(f"--top must be between 1 and {MAX_TOP}, got {args.top}")
    text = _read_text(args.text)
    if not text.strip():
        raise UsageError("TEXT is empty: describe the symptom, the claim or paste a log line")
    code = _read_code(args.code) if args.code else None

    from gradient_doctor.knowledge.matcher import match

    try:
        result = match(text, code=code, top_k=args.top)
    except Exception as exc:
        # Imported here: a match served from the index snapshot never loads the YAML loader.
        from gradient_doctor.knowledge.loader import KnowledgeError

        if not isinstance(exc, KnowledgeError):
            raise
        lines = str(exc).splitlines()
        first = lines[1].strip(" -") if len(lines) > 1 else lines[0]
        raise UsageError(f"the knowledge base is invalid: {first}") from None
    if args.format == "json":
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(markdown(result))
    return EXIT_OK


def _bullet(label: str, value: str) -> str:
    return f"   - {label}: {' '.join(value.split())}\n"


def markdown(result: object) -> str:
    """The match result as a short ranked Markdown list (advice in full for the top match)."""
    from gradient_doctor.knowledge.matcher import MatchResult, get_matcher

    assert isinstance(result, MatchResult)
    # The matcher's entry cards carry the advice: no YAML parsing or model building here.
    cards = get_matcher().cards
    out: list[str] = []
    if result.out_of_scope:
        out.append("**Outside gradient management.**")
        if result.pointer:
            out.append(" " + " ".join(result.pointer.split()))
        out.append("\n\n")
    if result.numbers:
        shown = ", ".join(f"{k}={v:g}" for k, v in result.numbers.items())
        out.append(f"Read from the text: {shown}\n\n")
    for name, values in result.series.items():
        if len(values) >= 2:
            trend = " → ".join(f"{v:.3g}" for v in values[:8]) + (" → …" if len(values) > 8 else "")
            out.append(f"Read as a series: {name} {trend}\n\n")
    if not result.matches:
        out.append("No catalogue entry matches that text.\n")
        return "".join(out)
    for rank, m in enumerate(result.matches, start=1):
        severity = f", {m.severity}" if m.severity else ""
        out.append(f"{rank}. **{m.title}** — `{m.id}` ({m.kind}{severity}, score {m.score:.1f})\n")
        if m.reasons:
            out.append(_bullet("why", "; ".join(m.reasons[:3])))
        if rank > 1:
            continue
        card = cards.get(m.id)
        if card is None:
            continue
        if card.say_instead:
            out.append(_bullet("say instead", card.say_instead))
        if card.fix:
            out.append(_bullet("fix", card.fix))
        for check in card.first_checks[:3]:
            out.append(_bullet("check", check))
        if card.snippets:
            out.append(_bullet("fix snippets", ", ".join(card.snippets)))
    return "".join(out)
