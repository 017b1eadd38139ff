"""Options more than one ``fastload`` command takes.

``-o KEY=VALUE`` (``--storage-option``) passes an fsspec storage option to the store, the
same way for ``fastload cache warm`` and ``fastload bench``; a value that parses as JSON is
used as that JSON (numbers, booleans, objects).

Example::

    >>> storage_options(("endpoint_url=http://127.0.0.1:9000", 'latency={"latency": 0.1}'))
    {'endpoint_url': 'http://127.0.0.1:9000', 'latency': {'latency': 0.1}}
"""

from __future__ import annotations

import json
from typing import Any

import click


def storage_options(pairs: tuple[str, ...], option: str = "--storage-option") -> dict[str, Any]:
    """The storage options of repeated ``-o KEY=VALUE`` (``option`` names the flag in the
    error); a malformed pair exits 2."""
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
