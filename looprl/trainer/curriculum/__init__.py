"""Which training tasks a step draws: a curriculum that follows the pass rate, and hints that fade.

`config.py` holds the `[curriculum]` and `[hints]` sections, `controller.py` the band
controller's rules (pure functions), `sampler.py` the `Curriculum` the trainer draws tasks from
and reports scored groups to (docs/config.md, docs/authoring.md "Hints").
"""
