"""Pictures and data of a pipeline: export, renderers, Graphviz, HTML and diff.

What belongs here: pure functions from a :class:`~initpipe.Pipeline` (or its JSON export)
to text — no argument parsing (that is :mod:`initpipe.cli`) and no running of stages.

- :mod:`.export` — the pipeline as schema-versioned JSON data, the one model every drawing
  reads; selection by phase/focus; trace durations merged in;
- :mod:`.render` — text, Mermaid, DOT and JSON renderers;
- :mod:`.graphviz` — ``dot`` for SVG/PNG (optional system tool);
- :mod:`.html` — one self-contained interactive page;
- :mod:`.diff` — added/removed stages and edges between two exports.

Import the module you need: this package re-exports nothing, so ``initpipe graph`` pays
only for what a command uses (HTML, diff and Graphviz's subprocess machinery cost about
50 ms of start-up together).
"""
