"""Pictures and data of a pipeline: export, renderers, Graphviz, HTML and diff.

What belongs here: pure functions from a :class:`~initpipe.Pipeline` (or its JSON export)
to text — no argument parsing (that is :mod:`initpipe.cli`) and no running of stages.

- :mod:`.export` — the pipeline as schema-versioned JSON data, the one model every drawing
  reads; selection by phase/focus; trace durations merged in;
- :mod:`.render` — text, Mermaid, DOT and JSON renderers;
- :mod:`.graphviz` — ``dot`` for SVG/PNG (optional system tool);
- :mod:`.html` — one self-contained interactive page;
- :mod:`.diff` — added/removed stages and edges between two exports.
"""

from __future__ import annotations

from .diff import diff_views, render_diff_text
from .export import SCHEMA_VERSION, export, load_export, select, with_trace
from .graphviz import graphviz
from .html import render_html
from .render import RENDERERS, render_dot, render_json, render_mermaid, render_text

__all__ = [
    "RENDERERS",
    "SCHEMA_VERSION",
    "diff_views",
    "export",
    "graphviz",
    "load_export",
    "render_diff_text",
    "render_dot",
    "render_html",
    "render_json",
    "render_mermaid",
    "render_text",
    "select",
    "with_trace",
]
