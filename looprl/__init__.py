"""looprl: train agentic reasoners with token-exact multi-turn RL."""
