"""A typer group whose commands are imported and built only when one is looked up.

typer builds every registered command (a signature walk and one click parameter per option)
and the CLI imported every command module before any of them ran. `LazyGroup.commands` maps
each name to `"module:function"` instead and builds a command on first lookup, the way typer
itself would have (`Typer.command` then `get_command_from_info`). Listing the names builds
nothing. `exl3tool --help` looks every command up; while the group's help is written, a command
not built yet is a `_Listed` stand-in holding what the listing reads (its name and help, set as
typer sets them), which builds the real command for anything else. So it prints what it printed
before without building eleven commands (~12 ms).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer._click import Command, Context


class _Commands(MutableMapping[str, "Command"]):
    """name -> click command; a `"module:function"` value is built on first access."""

    def __init__(self, table: dict[str, str], markup: Any, short: bool) -> None:
        self._items: dict[str, Command | str] = dict(table)
        self._markup, self._short = markup, short
        self.listing = False  # the group's help is being written: unbuilt ones are _Listed

    def __getitem__(self, name: str) -> Command:
        item = self._items[name]
        if isinstance(item, str):
            if self.listing:
                return _Listed(self, name, _function(item))  # type: ignore[return-value]
            item = self._items[name] = self._build(name, item)
        return item

    def _build(self, name: str, target: str) -> Command:
        factory = typer.Typer()  # the CommandInfo defaults of `app.command(name)`
        factory.command(name)(_function(target))
        return typer.main.get_command_from_info(
            factory.registered_commands[0],
            pretty_exceptions_short=self._short,
            rich_markup_mode=self._markup,
        )

    def __setitem__(self, name: str, command: Command) -> None:
        self._items[name] = command

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def _function(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _default_panel() -> Any:
    """`app.command(name)`'s rich_help_panel (typer's placeholder for "no panel")."""
    return inspect.signature(typer.Typer.command).parameters["rich_help_panel"].default


class _Listed:
    """A command in the group's help listing, before it is built: the attributes the listing
    reads, as `get_command_from_info` sets them for `app.command(name)` (the help is the
    function's docstring). Any other attribute builds the command and is read from it."""

    def __init__(self, commands: _Commands, name: str, fn: Any) -> None:
        self._commands = commands
        self.name = name
        self.help = inspect.getdoc(fn)
        self.short_help = None
        self.hidden = False
        self.deprecated = False
        self.rich_help_panel = _default_panel()

    def __getattr__(self, attr: str) -> Any:
        listing, self._commands.listing = self._commands.listing, False
        try:
            return getattr(self._commands[self.name], attr)
        finally:
            self._commands.listing = listing


class LazyGroup(TyperGroup):
    """A TyperGroup over `table` (name -> `"module:function"`, in listing order); subclasses
    set `table`."""

    table: ClassVar[dict[str, str]] = {}
    pretty_exceptions_short: ClassVar[bool] = True  # typer.Typer's default

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        commands = _Commands(self.table, self.rich_markup_mode, self.pretty_exceptions_short)
        commands.update(self.commands)  # any registered the ordinary way
        self.commands = commands

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # names only: TyperGroup's would build every command

    def format_help(self, ctx: Context, formatter: Any) -> None:
        commands = self.commands
        listing = isinstance(commands, _Commands)
        if listing:
            commands.listing = True  # type: ignore[union-attr]
        try:
            super().format_help(ctx, formatter)
        finally:
            if listing:
                commands.listing = False  # type: ignore[union-attr]
