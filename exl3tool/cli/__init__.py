"""Typer commands: parse arguments, call one library function, render, exit."""
