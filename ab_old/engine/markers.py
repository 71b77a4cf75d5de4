"""What user code marks for the capture: `graph_break()`, and the callables registered with
`allow_in_graph` / `disallow_in_graph`. Plain data below both the API and the capture."""

ALLOWED: set = set()      # callables put in the graph as-is (allow_in_graph)
DISALLOWED: set = set()   # callables that always break the graph (disallow_in_graph)


def graph_break() -> None:
    """Force a graph break here when compiled; a no-op when run eagerly."""
