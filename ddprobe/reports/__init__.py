"""Markdown and HTML reports from results files. Never imports torch."""
