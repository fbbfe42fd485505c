"""The one mapping from an exception to an exit code and a one-line message.

The CLI (`cli/common.py`) uses both; the gate (`actions/gate/run.py`, where a failing step
becomes a GT finding) uses the message, so a given error reads the same wherever it happens.
"""

from __future__ import annotations

from exl3tool.rules.errors import Exl3ToolError, Interrupted

# Exit codes (README "Exit codes"): what CI systems and scripts read.
EXIT_OK = 0
EXIT_FINDINGS = 1  # findings (errors, or warnings with --strict); an output was refused
EXIT_USAGE = 2  # the command line asks for something impossible, or an extra is missing
EXIT_INPUT = 3  # an input cannot be read at all
EXIT_SIGINT = 130  # Ctrl-C (128 + SIGINT)
EXIT_SIGTERM = 143  # terminated (128 + SIGTERM)


def exit_code(exc: BaseException) -> int:
    """The exit code an exception ends the command with."""
    if isinstance(exc, Interrupted):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGINT
    if isinstance(exc, Exl3ToolError):
        return exc.exit_code
    if isinstance(exc, OSError):  # a file that could not be opened or read (or written)
        return EXIT_INPUT
    return EXIT_FINDINGS


def message(exc: BaseException) -> str:
    """One line for the user: the error's own text, or what an unexpected one was; a word of
    more than `SHOWN_MAX` characters (a hostile file name) is cut."""
    if isinstance(exc, KeyboardInterrupt | Interrupted):
        return "interrupted" if exit_code(exc) == EXIT_SIGINT else "terminated"
    if isinstance(exc, Exl3ToolError):
        text = str(exc)
    elif isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename is not None else ""
        text = where + (exc.strerror or str(exc))
    else:
        text = f"internal error {type(exc).__name__}: {exc}"
    from exl3tool.io.fs import shown_words

    return shown_words(text)
