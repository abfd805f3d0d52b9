"""Rich Text to Textual Strips directly, for the widgets that draw with the line API."""

from __future__ import annotations

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text


def text_segments(text: Text, console: Console, base: Style) -> list[Segment]:
    """The segments of one line of text over a base style. Text.render() leaves out the text's
    own style (Rich applies it when printing), so it is added here."""
    own = console.get_style(text.style) if text.style else None
    under = base + own if own else base
    return [Segment(s.text, under + s.style if s.style else under) for s in text.render(console, end="")]
