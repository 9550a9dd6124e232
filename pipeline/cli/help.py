"""Help-text classes for the ``channel-health`` command line (issue #17).

typer >= 0.2x renders every flag with a type column (``--help <bool>``,
``--list <bool>``) and a required argument as ``{sql}`` in the usage line.
A flag takes no value, so its type column stays empty here, and arguments
read as the conventional ``SQL`` / ``[SQL]``. Only help rendering changes:
parsing, defaults and errors are typer's.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup


class _PlainHelp:
    """Mixin for typer's command and group classes (see the module docstring)."""

    def get_help_option(self, ctx: Any) -> Any:
        """typer's ``--help`` option, shown without a type."""
        opt = super().get_help_option(ctx)  # type: ignore[misc]
        if opt is not None and opt.metavar is None:
            opt.metavar = ""
        return opt

    def get_params(self, ctx: Any) -> list:
        """The command's parameters; flags (no value) get an empty type column."""
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """typer's usage pieces with ``SQL`` / ``[SQL]`` in place of ``{sql}`` / ``[sql]``."""
        pieces = super().collect_usage_pieces(ctx)  # type: ignore[misc]
        for p in self.get_params(ctx):
            if not isinstance(p, TyperArgument):
                continue
            name = (p.metavar or (p.name or "").upper()) + ("..." if p.nargs != 1 else "")
            for old in p.get_usage_pieces(ctx):
                if old in pieces:
                    pieces[pieces.index(old)] = name if p.required else f"[{name}]"
        return pieces


class PlainHelpCommand(_PlainHelp, TyperCommand):
    """A typer command whose help shows no ``<bool>`` for flags and ``SQL`` for arguments."""


class PlainHelpGroup(_PlainHelp, TyperGroup):
    """A typer group (the ``channel-health`` app) with the same help rendering."""


def use_plain_help(app: Any) -> None:
    """Give every command of typer ``app`` (registered so far) the plain help classes."""
    for info in app.registered_commands:
        if not info.cls or info.cls is TyperCommand:  # typer's default: keep any other class
            info.cls = PlainHelpCommand
    for info in app.registered_groups:
        if not info.cls or info.cls is TyperGroup:
            info.cls = PlainHelpGroup
        if info.typer_instance:
            use_plain_help(info.typer_instance)
