"""Reward-hacking monitors: rolling signals over a run that warn or stop it, and their replay."""
