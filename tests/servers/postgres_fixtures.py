"""Pytest fixtures (filled in by the owning work item)."""
