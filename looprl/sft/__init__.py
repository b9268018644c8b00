"""Supervised fine-tuning: warm starts on conversations, and the scripted teachers that write them."""
