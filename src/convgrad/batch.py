"""benchdnn-style option lines and batch files, shared by ``convgrad graph`` and ``convgrad conv``.

A batch file holds command lines, one case a line; ``#`` starts a comment. Driver options
(``--dt=...``) persist from line to line until ``--reset`` (back to the defaults); a case
(``--case=FILE`` for graphs, a descriptor for conv) runs with the options in force; ``--batch=FILE``
reads another batch file in place. Relative paths are resolved against the folder of the batch
file that names them. A bad line becomes a failed case whose message names the file, the line and
the field; the lines after it still run.

Limits (each refused with a message that names it): files of :data:`MAX_FILE_BYTES` and regular
files only (a FIFO or a device is not opened for reading), lines of
:data:`~convgrad.untrusted.MAX_LINE_CHARS`, words of :data:`~convgrad.untrusted.MAX_TOKEN_CHARS`,
batch files nested :data:`MAX_INCLUDE_DEPTH` deep. A batch's cases are counted before any runs
(:meth:`BatchReader.count`), in time proportional to its files' size however often they include
each other, so a caller can refuse more than it wants to run.
"""

from __future__ import annotations

import itertools
import math
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .untrusted import MAX_LINE_CHARS, check_token, shorten, split_line

__all__ = ["Knob", "Case", "BatchReader", "read_bytes", "read_text", "MAX_FILE_BYTES", "MAX_INCLUDE_DEPTH"]

#: Largest case or batch file read (a device such as /dev/zero must not be read forever).
MAX_FILE_BYTES = 64 * 2**20
#: Deepest nesting of batch files (the file given on the command line is level 1).
MAX_INCLUDE_DEPTH = 32
_BOM = b"\xef\xbb\xbf"
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_bytes(path: Path) -> bytes:
    """A case or batch file's bytes; OSError if it cannot be opened, ValueError (why) if it is not
    a regular file (checked before reading: a FIFO would block) or larger than :data:`MAX_FILE_BYTES`."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # opening a FIFO must not wait for a writer
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a file")
            raise ValueError(f"not a regular file ({kind})")
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    return data


def _resolved(path: Path) -> Path:
    """``path.resolve()``, or ``path`` itself where it cannot be resolved (a NUL byte in a name
    a file gave, a symlink loop): reading it then fails with a named error."""
    try:
        return path.resolve()
    except (OSError, ValueError, RuntimeError):
        return path


def _not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 is: its line, its byte in that line, its value."""
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - data.rfind(b"\n", 0, exc.start)
    return f"line {line}, byte {column} (0x{data[exc.start]:02x}) is not UTF-8 text"


def read_text(path: Path) -> str:
    """A case file's text: :func:`read_bytes` decoded; ValueError naming the line if it is not UTF-8."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(_not_utf8(data, exc)) from None


@dataclass(frozen=True)
class Knob:
    """One driver option: ``--NAME=VALUE`` with a parser that raises ValueError on bad values; a
    list option takes comma-separated values, each parsed on its own, and runs each."""

    name: str
    help: str
    parse: Callable[[str], Any]
    default: str = ""
    is_list: bool = False

    def values(self, text: str) -> list[str]:
        """The values ``text`` holds (a list option's comma-separated items)."""
        return text.split(",") if self.is_list else [text]

    def check(self, text: str) -> None:
        """ValueError if a value of ``text`` does not parse."""
        for value in self.values(text):
            self.parse(value)


@dataclass(frozen=True)
class Case:
    """One case to run: its target (case file or descriptor), the non-default options in force,
    where it came from, and the error if its line could not be read (then the target is the
    offending text: the token, the line or ``--batch=FILE``)."""

    target: str
    knobs: tuple[tuple[str, str], ...] = ()
    origin: str = "command line"
    error: str | None = None

    def knob(self, name: str, default: str = "") -> str:
        return dict(self.knobs).get(name, default)


class BatchReader:
    """Turns option tokens and batch files into cases.

    ``trigger`` names the option that runs a case (``case`` for graphs); without one, every plain
    argument (not starting with ``--``) is a case (conv descriptors).
    """

    def __init__(self, knobs: dict[str, Knob], trigger: str | None) -> None:
        self.knobs = knobs
        self.trigger = trigger
        self._counts: dict[tuple[Path, tuple[Path, ...], tuple[tuple[str, str], ...]],
                           tuple[int, tuple[tuple[str, str], ...]]] = {}

    def defaults(self) -> dict[str, str]:
        return {name: knob.default for name, knob in self.knobs.items()}

    def case(self, target: str, settings: dict[str, str], origin: str) -> Case:
        """A case with a snapshot of the options in force (only those off their default)."""
        knobs = tuple((k, v) for k, v in settings.items() if v != self.knobs[k].default)
        return Case(target, knobs, origin)

    def cases(self, target: str, settings: dict[str, str], origin: str) -> Iterator[Case]:
        """The cases of ``target``: one per combination of the list options' values (benchdnn's
        cartesian product, the first option outermost)."""
        for combination in itertools.product(*(self.knobs[k].values(v) for k, v in settings.items())):
            yield self.case(target, dict(zip(settings, combination)), origin)

    def combinations(self, settings: dict[str, str]) -> int:
        """How many cases :meth:`cases` makes of one target under ``settings``."""
        return math.prod(len(self.knobs[k].values(v)) for k, v in settings.items())

    def _action(self, token: str, folder: Path, origin: str) -> tuple[str, str] | Case:
        """What one token does, whatever the options in force: ``("reset", "")``, ``("batch",
        path)``, ``("case", target)``, ``("knob", name)`` (its value is valid), or the failed case
        that ends its line."""
        name, equals, value = token.partition("=")
        try:
            check_token(token)
        except ValueError as exc:
            return Case(token, error=f"{origin}: {exc}", origin=origin)
        if token == "--reset":
            return "reset", ""
        if name == "--batch" and equals:
            return "batch", str(folder / value)
        if self.trigger and name == f"--{self.trigger}" and equals:
            return "case", str(folder / value)
        if name.startswith("--") and name[2:] in self.knobs and equals:
            try:
                self.knobs[name[2:]].check(value)
            except ValueError as exc:
                return Case(token, error=f"{origin}: {name}: {exc}", origin=origin)
            return "knob", name[2:]
        if token.startswith("-") or self.trigger:
            expected = ", ".join(f"--{k}=" for k in self.knobs)
            return Case(token, error=f"{origin}: {shorten(token, 80)!r}: unknown option (expected --reset, --batch=, "
                        + (f"--{self.trigger}=, " if self.trigger else "") + f"{expected})", origin=origin)
        return "case", token

    def expand(self, tokens: list[str], settings: dict[str, str], folder: Path, origin: str,
               stack: tuple[Path, ...] = ()) -> Iterator[Case]:
        """The cases of one line; ``settings`` is updated in place and persists to the next line."""
        for token in tokens:
            action = self._action(token, folder, origin)
            if isinstance(action, Case):
                yield action
                return
            kind, value = action
            if kind == "reset":
                settings.update(self.defaults())
            elif kind == "batch":
                yield from self.read(Path(value), settings, stack, f"{origin}: {token}")
            elif kind == "case":
                yield from self.cases(value, settings, origin)
            else:
                settings[value] = token.partition("=")[2]

    def _lines(self, path: Path, stack: tuple[Path, ...], origin: str) -> Iterator[tuple[str, list[str] | Case]]:
        """A batch file's lines as ``(where, words)``, or ``(where, failed case)`` for a line that
        cannot be read, or for the whole file (unreadable, including itself, nested too deep)."""
        if _resolved(path) in stack:
            yield origin, Case(f"--batch={path}", error=f"{origin}: batch file {path} includes itself", origin=origin)
            return
        if len(stack) >= MAX_INCLUDE_DEPTH:
            yield origin, Case(f"--batch={path}", error=f"{origin}: batch file {path} is nested {len(stack) + 1} "
                               f"levels deep: expected at most {MAX_INCLUDE_DEPTH}", origin=origin)
            return
        try:
            data = read_bytes(path)
        except (OSError, ValueError) as exc:
            why = exc.strerror or exc if isinstance(exc, OSError) else exc
            yield origin, Case(f"--batch={path}", error=f"{origin}: cannot read batch file {path} ({why})",
                               origin=origin)
            return
        for number, raw in enumerate(data.removeprefix(_BOM).splitlines(), 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                why = _not_utf8(raw, exc).removeprefix("line 1, ")
                yield where, Case(raw.decode("utf-8", "replace"), error=f"{where}: {why}", origin=where)
                continue
            if len(line) > MAX_LINE_CHARS:
                yield where, Case(line, error=f"{where}: a line of {len(line)} characters: expected at "
                                  f"most {MAX_LINE_CHARS}", origin=where)
                continue
            try:
                yield where, split_line(line.split("#", 1)[0])
            except ValueError as exc:
                yield where, Case(line, error=f"{where}: cannot split the line ({exc})", origin=where)

    def read(self, path: Path, settings: dict[str, str], stack: tuple[Path, ...] = (),
             origin: str = "command line") -> Iterator[Case]:
        """The cases of a batch file (nested batches included), read as they are run."""
        inner = (*stack, _resolved(path))
        for where, words in self._lines(path, stack, origin):
            if isinstance(words, Case):
                yield words
            else:
                yield from self.expand(words, settings, path.parent, where, inner)

    def count(self, path: Path, settings: dict[str, str], stack: tuple[Path, ...] = (),
              origin: str = "command line") -> int:
        """How many cases :meth:`read` gives for ``path`` under ``settings`` (updated in place as
        :meth:`read` does), without building them: each file is read once per chain of files
        that includes it and options in force, however often it is included."""
        key = (_resolved(path), stack, tuple(settings.items()))
        if key not in self._counts:
            total = 0
            for where, words in self._lines(path, stack, origin):
                if isinstance(words, Case):
                    total += 1
                    continue
                for token in words:
                    action = self._action(token, path.parent, where)
                    if isinstance(action, Case):
                        total += 1
                        break
                    kind, value = action
                    if kind == "case":
                        total += self.combinations(settings)
                    elif kind == "batch":
                        total += self.count(Path(value), settings, (*stack, key[0]), f"{where}: {token}")
                    elif kind == "reset":
                        settings.update(self.defaults())
                    else:
                        settings[value] = token.partition("=")[2]
            self._counts[key] = (total, tuple(settings.items()))
        total, after = self._counts[key]
        settings.update(after)
        return total
