"""Turning results into text, Markdown, JUnit or JSON; the one colour table."""
