"""Turning results into text, Markdown, JUnit or JSON; the one colour table."""


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 patch``, ``2 patches``: a count and its noun, agreed."""
    return f"{n} {word if n == 1 else many or word + 's'}"
