"""Jinja2 templates: the report and the fix snippets, rendered with the user's own names."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jinja2


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared Jinja2 environment over the templates shipped in this package."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("gradient_doctor.templates", "."),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template_name: str, **context: Any) -> str:
    """Render ``template_name`` (a path inside this package) with ``context``."""
    return environment().get_template(template_name).render(**context)
