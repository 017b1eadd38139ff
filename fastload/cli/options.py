"""Command-line options shared by the ``fastload`` commands."""

from __future__ import annotations

import json
from typing import Any

import click

__all__ = ["storage_options_of"]


def storage_options_of(pairs: tuple[str, ...], option: str = "--storage-option") -> dict[str, Any]:
    """fsspec storage options from ``KEY=VALUE`` pairs (a VALUE that parses as JSON is that
    JSON: ``anon=true``, ``client_kwargs={"endpoint_url": "..."}``)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=option)
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options
