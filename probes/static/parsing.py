"""Parsing user source for any Python from 3.8 to 3.14, whatever interpreter runs the analyser.

CPython's own parser (``ast``) runs first: it is fast, it gives the best error messages, and it
rejects pathological nesting cleanly, where libcst's native parser can overflow its stack and
take the process down. But it only knows the grammar of the running interpreter, and users'
code targets newer Pythons than ours (PEP 701 f-strings such as ``f"{Path(d) / "ckpt"}"``,
``except A, B:``, template strings). When CPython rejects a file, libcst (whose grammar
follows the newest Python) gets a second try, behind :func:`nesting_guard`: valid code of
any version stays within CPython's own limits (200 nested brackets, 100 indentation levels),
so the guard refuses only code that no Python accepts.
"""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize
import warnings
from dataclasses import dataclass

import libcst as cst

__all__ = ["Parsed", "nesting_guard", "parse_source", "syntax_error"]

BOM = "\ufeff"
MAX_BRACKET_DEPTH = 200
"""CPython's tokenizer limit on nested brackets (``MAXLEVEL``), the same in every version."""
MAX_INDENT_DEPTH = 100
"""CPython's tokenizer limit on indentation levels (``MAXINDENT``)."""
MAX_OPERATOR_RUN = 200
"""Unary operators in a row (``- - - x``): far beyond real code, well below libcst's limit."""

_STRING_PREFIX = frozenset("rRbBuUfFtT")


@dataclass(frozen=True)
class Parsed:
    """A parsed file: libcst's tree, and CPython's when the running interpreter could read it."""

    module: cst.Module
    tree: ast.Module | None
    legacy: bool = False
    """The file uses ``async`` / ``await`` as names (Python 3.6 and older): it was read with
    them renamed in place (same length, so every line and column holds), and no patch is made
    against that text."""
    notebook: bool = False
    """The file is a notebook exported as a script (Colab's "Download .py", Jupyter's
    ``--to script``) with IPython shell and magic lines (``!pip install ...``,
    ``%matplotlib inline``) left in: it was read with each such line as ``pass`` (line numbers
    hold), and no patch is made against that text."""


def _cpython_error(exc: SyntaxError) -> str:
    line = max(exc.lineno or 1, 1)
    col = max(exc.offset or 1, 1)
    return f"syntax error at line {line}:{col}: {' '.join(str(exc.msg).split())}"


def _cpython(source: str) -> ast.Module | str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes is not our concern
            return ast.parse(source)
    except SyntaxError as exc:
        return _cpython_error(exc)
    except (RecursionError, MemoryError):
        return "syntax error at line 1:1: the code is nested too deeply to analyse"
    except ValueError as exc:  # NUL bytes
        first = str(exc).splitlines()[0] if str(exc) else "invalid"
        return f"syntax error at line 1:1: {first}"


def parse_source(source: str, *, checked: bool = False) -> Parsed | str:
    """Both trees of ``source``, or a one-line reason why it cannot be analysed.

    ``checked``: CPython already parsed this exact text (the project index did), so libcst
    runs directly and no CPython tree is returned. Never raises. A leading byte-order mark is
    ignored (it is not code).
    """
    source = source.removeprefix(BOM)
    if checked:
        checked_module = _libcst(source)
        return checked_module if isinstance(checked_module, str) else Parsed(checked_module, None)
    tree = _cpython(source)
    if isinstance(tree, str):
        if "nested too deeply" in tree or "null bytes" in tree.lower():
            return tree
        # Perhaps valid code for a newer Python than the one running: let libcst try, unless
        # the nesting is beyond what any Python accepts (libcst could crash on it).
        guard = nesting_guard(source)
        if guard is not None:
            return f"{tree} ({guard})" if "nest" not in tree else tree
        module = _libcst(source)
        if isinstance(module, str):
            return _legacy(source) or _notebook_export(source) or tree
        return Parsed(module, None)
    module = _libcst(source)
    if isinstance(module, str):
        return module
    return Parsed(module, tree)


_IPYTHON_LINE = re.compile(r"^([ \t]*)[!%][^\r\n]*", re.MULTILINE)
"""A line that IPython runs as a shell command (``!nvidia-smi``) or a magic (``%cd data``,
``%%time``): the first character of the line's text is ``!`` or ``%``, which no Python
statement starts with."""


def _notebook_export(source: str) -> Parsed | None:
    """``source`` read as a notebook exported to a script, when its IPython shell and magic
    lines are all that keeps Python from reading it; None otherwise.

    Each such line becomes ``pass`` at its own indentation, so every line keeps its number
    and a command inside a block leaves the block valid. A ``%`` that continues an expression
    inside brackets or after a backslash would become a ``pass`` where no statement may stand,
    and the reread fails: such text is never mistaken for a magic.
    """
    if "!" not in source and "%" not in source:
        return None
    replaced, count = _IPYTHON_LINE.subn(r"\1pass", source)
    if count == 0:
        return None
    tree = _cpython(replaced)
    module = _libcst(replaced)
    if isinstance(module, str):
        return None
    return Parsed(module, tree if not isinstance(tree, str) else None, notebook=True)


LEGACY_NAMES = {"async": "asyn_", "await": "awai_"}
"""Python 3.6 and older let ``async`` and ``await`` be names (``x.cuda(async=True)``, common in
PyTorch code of that era); each is read as a name of the same length."""
_ASYNC_KEYWORD_FOLLOWERS = frozenset({"def", "for", "with"})
"""``async`` is the keyword only right before these."""
_OPERAND_OPENERS = frozenset({"(", "[", "{", "~"})


def _legacy(source: str) -> Parsed | None:
    """``source`` read as Python 3.6 code, when using ``async`` / ``await`` as names is what
    keeps newer grammars from reading it; None otherwise."""
    if not any(word in source for word in LEGACY_NAMES):
        return None
    if any(stand_in in source for stand_in in LEGACY_NAMES.values()):
        return None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    offsets = [0]  # where each of tokenize's lines starts (not str.splitlines: it splits at \f)
    for line in io.StringIO(source).readlines():
        offsets.append(offsets[-1] + len(line))
    significant = [t for t in tokens if t.type not in _TRIVIA]
    edits: list[int] = []
    for index, token in enumerate(significant):
        if token.type != tokenize.NAME or token.string not in LEGACY_NAMES:
            continue
        before = significant[index - 1].string if index > 0 else ""
        follower = significant[index + 1] if index + 1 < len(significant) else None
        if token.string == "async":
            as_name = follower is None or follower.string not in _ASYNC_KEYWORD_FOLLOWERS
        else:
            as_name = before in {".", "def", "class"} or not _starts_operand(follower, token)
        if as_name:
            row, col = token.start
            edits.append(offsets[row - 1] + col)
    if not edits:
        return None
    chars = list(source)
    for start in edits:
        word = source[start : start + 5]
        chars[start : start + 5] = LEGACY_NAMES[word]
    renamed = "".join(chars)
    module = _libcst(renamed)
    if isinstance(module, str):
        return None
    tree = _cpython(renamed)
    return Parsed(module, tree if not isinstance(tree, str) else None, legacy=True)


def restore_legacy_names(text: str) -> str:
    """``text`` (a message quoting code read by ``_legacy``) with the user's own names back:
    the stand-ins never occur in such a file, so every one of them is a renamed name."""
    for name, stand_in in LEGACY_NAMES.items():
        text = text.replace(stand_in, name)
    return text


def _starts_operand(follower: tokenize.TokenInfo | None, token: tokenize.TokenInfo) -> bool:
    """``follower`` begins the operand of an ``await`` expression on the same line (a name,
    a literal, a bracket), rather than ending ``await`` used as a name (``await = 1``)."""
    if follower is None or follower.start[0] != token.end[0]:
        return False
    if follower.type in {tokenize.NUMBER, tokenize.STRING}:
        return True
    if follower.type == tokenize.NAME:
        constants = {"None", "True", "False"}
        return not keyword.iskeyword(follower.string) or follower.string in constants
    return follower.string in _OPERAND_OPENERS


_TRIVIA = frozenset(
    {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
)


def _libcst(source: str) -> cst.Module | str:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return f"syntax error at line {exc.raw_line}:{exc.raw_column + 1}: {exc.message}"
    except (RecursionError, MemoryError):
        return "syntax error at line 1:1: the code is nested too deeply to analyse"
    except Exception as exc:  # libcst raises a few other types on odd input
        return f"could not parse the file: {type(exc).__name__}"


def syntax_error(source: str) -> str | None:
    """A one-line reason when no supported Python can parse ``source``, else None."""
    parsed = parse_source(source)
    return parsed if isinstance(parsed, str) else None


def nesting_guard(source: str) -> str | None:
    """Why ``source`` is nested beyond what any Python accepts, or None.

    A small lexer that knows strings (every prefix, triple quotes, and PEP 701 f-strings whose
    replacement fields hold code with quotes of their own) and comments counts the bracket
    depth of the code, the indentation levels and the longest run of unary operators.
    """
    depth = 0
    max_depth = 0
    indents = [0]
    operator_run = 0
    # Each entry: the quote of an open string, or "{" for a replacement field inside an
    # f-string (code again, until its closing brace at bracket depth ``field_depth``).
    strings: list[tuple[str, bool, int]] = []  # (quote, formatted, bracket depth at "{")
    at_line_start = True
    i = 0
    n = len(source)
    while i < n:
        if strings and strings[-1][0] != "{":
            quote, formatted, _ = strings[-1]
            ch = source[i]
            if ch == "\\":
                i += 2
                continue
            if source.startswith(quote, i):
                strings.pop()
                i += len(quote)
                continue
            if formatted and ch == "{":
                if source.startswith("{{", i):
                    i += 2
                    continue
                strings.append(("{", False, depth))
                i += 1
                continue
            if ch == "\n" and len(quote) == 1:
                strings.pop()  # unterminated string: the error is CPython's to report
            i += 1
            continue
        ch = source[i]
        if at_line_start:
            width = 0
            while i < n and source[i] in " \t\f":
                width += 8 - width % 8 if source[i] == "\t" else 1
                i += 1
            if i >= n:
                break
            if source[i] not in "#\r\n" and depth == 0 and not strings:
                while width < indents[-1]:
                    indents.pop()
                if width > indents[-1]:
                    indents.append(width)
                    if len(indents) - 1 > MAX_INDENT_DEPTH:
                        return f"more than {MAX_INDENT_DEPTH} levels of indentation"
            at_line_start = False
            continue
        if ch == "#":
            while i < n and source[i] not in "\r\n":
                i += 1
            continue
        if ch in "\r\n":
            if depth == 0 and not strings:
                at_line_start = True
            i += 1
            continue
        if ch == "\\" and i + 1 < n and source[i + 1] in "\r\n":
            i += 2
            continue
        if ch in "\"'":
            start = i
            while start > 0 and source[start - 1] in _STRING_PREFIX:
                start -= 1
            prefix = source[start:i].lower()
            formatted = "f" in prefix or "t" in prefix
            quote = ch * 3 if source.startswith(ch * 3, i) else ch
            strings.append((quote, formatted, depth))
            i += len(quote)
            operator_run = 0
            continue
        if ch in "([{":
            depth += 1
            if depth > max_depth:
                max_depth = depth
                if depth > MAX_BRACKET_DEPTH:
                    return f"more than {MAX_BRACKET_DEPTH} nested brackets"
        elif ch in ")]}":
            if strings and strings[-1][0] == "{" and ch == "}" and depth == strings[-1][2]:
                strings.pop()  # end of an f-string replacement field: back in the string
                i += 1
                continue
            depth = max(depth - 1, 0)
        if ch in "-+~":
            operator_run += 1
            if operator_run > MAX_OPERATOR_RUN:
                return f"more than {MAX_OPERATOR_RUN} unary operators in a row"
        elif not ch.isspace():
            operator_run = 0
        i += 1
    return None
