"""Text from files and command lines that other people wrote: the limits on reading it, and the
one way each of printing it and quoting it.

- :func:`printable`: every text the command line prints that came from outside (names, kinds,
  paths, option values, error messages) passes through it, so control characters (terminal
  escape sequences, newlines), other invisible characters and lone surrogates are shown escaped
  (``\\x1b``, ``\\n``, ``\\u202e``, ``\\ud800``) and never reach the terminal raw.
- :func:`shell_join`: every ``__REPRO:`` command is made of it: each word is quoted, so pasting the
  command runs convgrad with exactly those words and nothing else.
- :func:`split_line`: a batch line's words (POSIX shell quoting, as :func:`shlex.split`), in
  linear time.
- :func:`integer`: an integer from a number in an option or a descriptor, at most :data:`MAX_DIGITS`
  digits (Python's own limit, 4300, is far beyond any size and its message names nothing).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

__all__ = ["MAX_LINE_CHARS", "MAX_TOKEN_CHARS", "MAX_DIGITS", "printable", "shell_join", "split_line",
           "check_token", "integer", "shorten", "MAX_NAME_CHARS"]

#: Longest batch-file line, in characters.
MAX_LINE_CHARS = 65_536
#: Longest word of a batch line (an option with its value, a case file, a descriptor).
MAX_TOKEN_CHARS = 16_384
#: Most digits of a number in an option or a descriptor (2^64 has 20).
MAX_DIGITS = 20
#: Longest case file or descriptor quoted in full in a message (longer ones are cut).
MAX_NAME_CHARS = 500

_QUOTING = re.compile(r"['\"\\]")
_BLANKS = re.compile(r"[ \t\r\n]+")  # shlex's whitespace
_WORD_PART = re.compile(r"""[^ \t\r\n'"\\]+|'[^']*'|"[^"\\]*(?:\\.[^"\\]*)*"|\\.|[ \t\r\n]+|(['"\\])""", re.S)
_ESCAPE_AT_END = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*\\', re.S)  # an unclosed "... ending in \\
_DOUBLE_QUOTED_ESCAPE = re.compile(r'\\([\\"])')


def printable(text: str) -> str:
    """``text`` with every character that is not printable (controls, format and separator
    characters other than the space, lone surrogates) written as its Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


def shorten(text: str, limit: int = 200) -> str:
    """``text`` cut to about ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _quote(word: str) -> str:
    """One shell word: :func:`shlex.quote`, or bash's ``$'...'`` with escapes when ``word`` holds
    characters that cannot be shown (a raw byte of a file name: ``\\xff``)."""
    if word.isprintable():
        return shlex.quote(word)
    out = []
    for c in word:
        if c in "\\'":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif "\udc80" <= c <= "\udcff":  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
            out.append(f"\\x{ord(c) - 0xdc00:02x}")
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\U{ord(c):08x}" if ord(c) > 0xffff else f"\\u{ord(c):04x}")
    return "$'" + "".join(out) + "'"


def shell_join(words: Iterable[str]) -> str:
    """A shell command line of ``words``, each quoted (see :func:`_quote`)."""
    return " ".join(_quote(word) for word in words)


def split_line(line: str) -> list[str]:
    """The words of ``line`` as :func:`shlex.split` gives them (POSIX quoting: '...', "..." with
    \\" and \\\\ escapes, \\ outside quotes; ``#`` is an ordinary character), in time linear in the
    line's length. ValueError as shlex's for an unclosed quotation or a trailing backslash."""
    if not _QUOTING.search(line):
        return [word for word in _BLANKS.split(line) if word]
    words: list[str] = []
    parts: list[str] | None = None  # the current word's parts, None between words
    for match in _WORD_PART.finditer(line):
        piece = match.group()
        if match.group(1) is not None:  # shlex's message: the first problem reading left to right
            trailing = piece == "\\" or (piece == '"' and _ESCAPE_AT_END.fullmatch(line, match.end()))
            raise ValueError("No escaped character" if trailing else "No closing quotation")
        if piece[0] in " \t\r\n":
            if parts is not None:
                words.append("".join(parts))
                parts = None
            continue
        if piece[0] == "'":
            piece = piece[1:-1]
        elif piece[0] == '"':
            piece = _DOUBLE_QUOTED_ESCAPE.sub(r"\1", piece[1:-1])
        elif piece[0] == "\\":
            piece = piece[1]
        if parts is None:
            parts = []
        parts.append(piece)
    if parts is not None:
        words.append("".join(parts))
    return words


def check_token(token: str) -> None:
    """ValueError if ``token`` is longer than :data:`MAX_TOKEN_CHARS`."""
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"{shorten(token, 40)!r}: a word of {len(token)} characters: expected at most "
                         f"{MAX_TOKEN_CHARS}")


def integer(text: str, what: str, signed: bool = False) -> int:
    """The integer written in ``text``: ASCII digits (at most :data:`MAX_DIGITS`), after a ``-``
    if ``signed``; ValueError naming ``what`` otherwise."""
    digits = text[1:] if signed and text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{what}: {shorten(text, 40)!r}: expected {'an' if signed else 'a non-negative'} integer")
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"{what}: a number of {len(text)} digits ({shorten(text, 20)!r}): expected at most "
                         f"{MAX_DIGITS} digits")
    return int(text)
