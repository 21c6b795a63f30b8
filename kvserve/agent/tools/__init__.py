"""The agent's tools, one module per family: files (read, more, list), editing (write, edit),
search, bash (+ jobs), web (visit_page)."""
