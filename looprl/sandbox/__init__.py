"""Sandboxed Python execution for tools: one executor interface, several isolation backends."""
