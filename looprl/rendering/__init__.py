"""Rendering: chat templates, token-exact rendering and tool-call parsing."""
