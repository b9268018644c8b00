"""The bundled environments, their registry and the `Environment` base they share.

Each module here is one environment with a `load_environment(**kwargs)` (`calculator`,
`calculator_text`, `python_math`, `search_qa`, `wordle`, `reasoning_gym_env`, `mixture`,
`hackable`), plus helpers of theirs (`arithmetic`, `corpus`); `base` holds `Environment` and its
shapes, `registry` loads any of them by name, `foreign` adapts verifiers and OpenEnv ones.

An author imports from `looprl` alone (`from looprl import ToolEnv, Rubric, load_environment`),
as every environment here does; this package exports nothing of its own.
"""
