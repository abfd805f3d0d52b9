"""SQLite store: the schema (schema.py) and the one class that reads and writes it (store.py)."""

from pkb_tui.store.store import Store, default_db_path  # noqa: F401
