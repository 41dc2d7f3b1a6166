"""benchdnn-style option lines and batch files, shared by ``convgrad graph`` and ``convgrad conv``.

A batch file holds command lines, one case a line; ``#`` starts a comment. Driver options
(``--dt=...``) persist from line to line until ``--reset`` (back to the defaults); a case
(``--case=FILE`` for graphs, a descriptor for conv) runs with the options in force; ``--batch=FILE``
reads another batch file in place. Relative paths are resolved against the folder of the batch
file that names them. A bad line becomes a failed case whose message names the file, the line and
the field; the lines after it still run.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Knob", "Case", "BatchReader", "read_text", "MAX_FILE_BYTES"]

#: Largest case or batch file read (a device such as /dev/zero must not be read forever).
MAX_FILE_BYTES = 64 * 2**20


def read_text(path: Path) -> str:
    """A case or batch file's text; OSError if it cannot be read, ValueError (why) if it is larger
    than :data:`MAX_FILE_BYTES` or not UTF-8."""
    with open(path, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // 2**20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"byte {exc.start} is not UTF-8 text") from None


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

    def expand(self, tokens: list[str], settings: dict[str, str], folder: Path, origin: str,
               stack: tuple[Path, ...] = ()) -> Iterator[Case]:
        """The cases of one line; ``settings`` is updated in place and persists to the next line."""
        for token in tokens:
            name, equals, value = token.partition("=")
            if token == "--reset":
                settings.update(self.defaults())
            elif name == "--batch" and equals:
                yield from self.read(folder / value, settings, stack, f"{origin}: {token}")
            elif self.trigger and name == f"--{self.trigger}" and equals:
                yield from self.cases(str(folder / value), settings, origin)
            elif name.startswith("--") and name[2:] in self.knobs and equals:
                try:
                    self.knobs[name[2:]].check(value)
                except ValueError as exc:
                    yield Case(token, error=f"{origin}: {name}: {exc}", origin=origin)
                    return
                settings[name[2:]] = value
            elif token.startswith("-") or self.trigger:
                expected = ", ".join(f"--{k}=" for k in self.knobs)
                yield Case(token, error=f"{origin}: {token!r}: unknown option (expected --reset, --batch=, "
                           + (f"--{self.trigger}=, " if self.trigger else "") + f"{expected})", origin=origin)
                return
            else:
                yield from self.cases(token, settings, origin)

    def read(self, path: Path, settings: dict[str, str], stack: tuple[Path, ...] = (),
             origin: str = "command line") -> Iterator[Case]:
        """The cases of a batch file (nested batches included)."""
        resolved = path.resolve()
        if resolved in stack:
            yield Case(f"--batch={path}", error=f"{origin}: batch file {path} includes itself", origin=origin)
            return
        try:
            lines = read_text(path).splitlines()
        except (OSError, ValueError) as exc:
            why = exc.strerror or exc if isinstance(exc, OSError) else exc
            yield Case(f"--batch={path}", error=f"{origin}: cannot read batch file {path} ({why})", origin=origin)
            return
        for number, raw in enumerate(lines, 1):
            where = f"{path}:{number}"
            try:
                tokens = shlex.split(raw.split("#", 1)[0])
            except ValueError as exc:
                yield Case(raw, error=f"{where}: cannot split the line ({exc})", origin=where)
                continue
            yield from self.expand(tokens, settings, path.parent, where, (*stack, resolved))
