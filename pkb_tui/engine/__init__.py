"""The evaluation engine: request -> launcher -> torchrun ranks (worker) -> events -> store.

Nothing under pkb_tui.engine imports Textual: GPU boxes run it with torch alone.
"""
