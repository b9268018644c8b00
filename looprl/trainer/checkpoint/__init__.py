"""Checkpoints: atomic single-process and sharded (FSDP) saves, verification, resume, export."""
