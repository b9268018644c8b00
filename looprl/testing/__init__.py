"""Test helpers: a scripted OpenAI-compatible server (`looprl.testing.fake_openai`) and friends."""
